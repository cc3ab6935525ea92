"""Avro binary encoding and decoding generated once per schema: the codec's fast path.

fastavro's ``schemaless_writer`` / ``schemaless_reader`` walk the parsed schema for every
record (a union is resolved by trying its branches, a record's fields are looked up by name in
the schema at each call): about 28 us to write and 12-20 us to read a typical ``RunEvent`` on
the reference machine, more than everything else an append or a projection does to it. For a
schema known in advance the walk can be done once: :func:`compile_schema` turns a parsed schema
into two Python functions written for it (straight-line field code, enums as lookup tables,
varints of small numbers from a table), which produce and read **the same bytes** as fastavro
(checked in ``tests/unit/schemas/test_avro_gen.py`` against fastavro over generated records of
every shape the bundled schemas allow) in about a third of the time.

The subset is what Runlog's schemas use: records, enums, arrays, maps, ``null``/``boolean``/
``int``/``long``/``double``/``string``/``bytes``, unions of ``null`` and one other type, named
types referenced by name. A schema outside it raises :class:`Unsupported`, and the codec keeps
fastavro for it. Only a record written with the reader's own schema takes the generated reader;
other writer schemas are resolved by fastavro (:mod:`runlog.schemas._codec`).

Errors: the generated writer raises whatever Python raises on a value of the wrong type (the
codec then lets fastavro write it, or name the problem, so behaviour on bad input is
fastavro's), and :class:`OutOfRange` for an ``int`` outside 32 bits (fastavro writes it; nothing
that follows the specification reads it back); the generated reader raises ``IndexError`` on a
body that ends early, and ``ValueError`` (or ``UnicodeDecodeError``) on a malformed one, and
reports where it stopped so the caller can refuse trailing bytes. The reader follows the
specification where fastavro is lenient: a negative union or enum index, a boolean byte other
than 0 and 1, an ``int`` outside 32 bits are refused, not read.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

__all__ = ["Decoder", "Encoder", "OutOfRange", "Unsupported", "compile_schema"]

Encoder = Callable[[Any], bytes]
"""A record's Avro dict -> its Avro binary body."""
Decoder = Callable[[bytes, int], tuple[Any, int]]
"""``(data, start)`` -> (the record's Avro dict, the offset after it)."""

_PRIMITIVES = frozenset({"null", "boolean", "int", "long", "double", "string", "bytes"})


class Unsupported(ValueError):
    """The schema uses a construct the generator does not handle (fastavro handles it)."""


def _varint(z: int) -> bytes:
    out = bytearray()
    while z & ~0x7F:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


_HIGH: dict[int, bytes] = {}
"""Varints of ``z >> 14`` for large numbers: a millisecond timestamp's upper groups change every 16 s."""


def _zigzag_varint(n: int) -> bytes:
    z = (n << 1) ^ (n >> 63)
    if z < 0x4000:
        return _varint(z)
    # the two low 7-bit groups come first (varints are little-endian), the rest from a cache
    high = _HIGH.get(z >> 14)
    if high is None:
        high = _varint(z >> 14)
        if len(_HIGH) < 4096:
            _HIGH[z >> 14] = high
    return bytes(((z & 0x7F) | 0x80, ((z >> 7) & 0x7F) | 0x80)) + high


_SMALL = tuple(_zigzag_varint(i) for i in range(256))
_LONGS: dict[int, bytes] = {}
"""Varints of other ``int`` s written lately: a timestamp recurs within its millisecond, a size or a
count across events (cleared whole past :data:`_LONGS_KEPT`; dict operations are atomic)."""
_LONGS_KEPT = 8192


def write_long(n: int, _small: tuple[bytes, ...] = _SMALL, _longs: dict[int, bytes] = _LONGS) -> bytes:
    """Avro's zig-zag varint of ``n`` (a 64-bit signed integer)."""
    if 0 <= n < 256:
        return _small[n]
    if type(n) is int:  # only ints are cached: a float equal to one is not a long
        b = _longs.get(n)
        if b is not None:
            return b
    if not -(1 << 63) <= n < (1 << 63):
        raise OverflowError(f"{n} does not fit an Avro long")
    b = _zigzag_varint(n)
    if type(n) is int:
        if len(_longs) >= _LONGS_KEPT:
            _longs.clear()
        _longs[n] = b
    return b


def read_long(d: bytes, p: int, b: int) -> tuple[int, int]:
    """The rest of a varint whose first byte ``b`` (>= 0x80) was read; (value, next offset).

    Raises:
        ValueError: the varint is longer than 10 bytes or its value outside a 64-bit long.
    """
    n = b & 0x7F
    shift = 7
    while b & 0x80:
        if shift == 70:
            raise ValueError("varint longer than 10 bytes")
        b = d[p]
        p += 1
        n |= (b & 0x7F) << shift
        shift += 7
    v = (n >> 1) ^ -(n & 1)
    if shift == 70 and not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"varint {v} outside a long")
    return v, p


def _skip_block_size(d: bytes, p: int) -> int:
    """After a negative block count, the block's byte size follows; it is not needed."""
    b = d[p]
    p += 1
    return read_long(d, p, b)[1] if b & 0x80 else p


class _Gen:
    """Writes the source of one function; ``names`` are the named types seen so far."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self.consts: dict[str, Any] = {}
        self.names: dict[str, Any] = {}
        self._n = 0

    globals_: ClassVar[Mapping[str, Any]] = {}
    """The names the generated function uses besides its constants."""

    def var(self, prefix: str) -> str:
        self._n += 1
        return f"{prefix}{self._n}"

    def compiled(self, name: str, filename: str) -> Any:
        """The function ``name`` the lines define, compiled under ``filename``."""
        ns: dict[str, Any] = {**self.globals_, **self.consts}
        exec(compile("\n".join(self.lines), filename, "exec"), ns)
        return ns[name]

    def resolve(self, t: Any) -> Any:
        """A type with named references replaced by their definitions (registering new ones)."""
        if isinstance(t, str):
            if t in _PRIMITIVES:
                return t
            if t not in self.names:
                raise Unsupported(f"unknown named type {t!r}")
            return self.names[t]
        if isinstance(t, dict):
            if "name" in t and t.get("type") in ("record", "enum", "fixed"):
                self.names[t["name"]] = t
            if t.get("type") in _PRIMITIVES:
                return t["type"]
        return t


def _union_branch(t: list[Any]) -> tuple[int, Any]:
    """(index of null, the other branch) of a ``null``-and-one-type union."""
    if len(t) != 2 or "null" not in t or t[0] == t[1]:
        raise Unsupported(f"union {t!r}: only null and one other type")
    i = t.index("null")
    return i, t[1 - i]


class _EncodeGen(_Gen):
    """Writes a record from its Avro dict. The hooks below (``py``: the Python type of the value, None
    here) are where :mod:`runlog.schemas._avro_objects` reads a record's object instead."""

    def emit(self, t: Any, expr: str, ind: int, py: Any = None) -> None:
        t = self.resolve(t)
        pad = "    " * ind
        out = self.lines.append
        if isinstance(t, str):
            if t in ("int", "long"):
                v = self.var("n")
                out(f"{pad}{v} = {expr}")
                if t == "int":  # fastavro writes any integer; a reader (this one) refuses it
                    out(f"{pad}if not {-(1 << 31)} <= {v} < {1 << 31}: OUT({v})")
                out(f"{pad}a(S[{v}] if 0 <= {v} < 256 else L({v}))")
            elif t in ("string", "bytes"):
                s, n = self.var("s"), self.var("n")
                if t == "string":
                    out(f"{pad}{s} = {expr}.encode()")
                else:
                    out(f"{pad}{s} = {expr}")
                    out(f"{pad}if type({s}) is not bytes: BAD({s})")
                out(f"{pad}{n} = len({s})")
                out(f"{pad}a(S[{n}] if {n} < 256 else L({n})); a({s})")
            elif t == "boolean":
                out(f"{pad}a(T if {expr} is True else F if {expr} is False else BAD({expr}))")
            elif t == "double":
                out(f"{pad}a(D({expr}))")
            elif t == "null":
                out(f"{pad}if {expr} is not None: BAD({expr})")
            return
        if isinstance(t, list):
            null, other = _union_branch(t)
            v = self.var("u")
            out(f"{pad}{v} = {expr}")
            out(f"{pad}if {v} is None:")
            out(f"{pad}    a({_SMALL[null]!r})")
            out(f"{pad}else:")
            out(f"{pad}    a({_SMALL[1 - null]!r})")
            self.emit(other, v, ind + 1, self.optional(py))
            return
        kind = t.get("type")
        if kind == "record":
            self.record(t, py, expr, ind)
        elif kind == "enum":
            table = self.var("E")
            self.consts[table] = {s: write_long(i) for i, s in enumerate(t["symbols"])}
            out(f"{pad}a({table}[{self.enum_value(t, py, expr)}])")
        elif kind in ("array", "map"):
            v, item = self.var("c"), self.var("i")
            out(f"{pad}{v} = {expr}")
            out(f"{pad}if {v}:")
            out(f"{pad}    a(L(len({v})))")
            if kind == "array":
                out(f"{pad}    for {item} in {v}:")
                self.emit(t["items"], item, ind + 2, self.items(py))
            else:
                k = self.var("k")
                out(f"{pad}    for {k}, {item} in {v}.items():")
                self.emit("string", k, ind + 2)
                self.emit(t["values"], item, ind + 2, self.values(py))
            out(f"{pad}a(Z)")
        else:
            raise Unsupported(f"type {kind!r}")

    def record(self, t: dict[str, Any], py: Any, expr: str, ind: int) -> None:
        r = self.var("r")
        self.lines.append(f"{'    ' * ind}{r} = {expr}")
        for f in t["fields"]:
            self.emit(f["type"], f"{r}[{f['name']!r}]", ind)

    def enum_value(self, t: dict[str, Any], py: Any, expr: str) -> str:
        """The expression of an enum's symbol (the key of its table of encodings)."""
        return expr

    def optional(self, py: Any) -> Any:
        """The type of a ``null`` union's other branch (None: a dict's value)."""
        return None

    def items(self, py: Any) -> Any:
        return None

    def values(self, py: Any) -> Any:
        return None


class _DecodeGen(_Gen):
    def long(self, target: str, pad: str) -> None:
        out = self.lines.append
        out(f"{pad}b = d[p]; p += 1")
        out(f"{pad}if b < 0x80: {target} = (b >> 1) ^ -(b & 1)")
        out(f"{pad}else: {target}, p = RL(d, p, b)")

    def length(self, target: str, pad: str) -> None:
        self.long(target, pad)
        self.lines.append(f"{pad}if {target} < 0: raise ValueError('negative length')")

    def emit(self, t: Any, target: str, ind: int, py: Any = None) -> None:
        """Reads ``t`` into ``target``: a dict for a record (the hooks, as in :class:`_EncodeGen`, are
        where :mod:`runlog.schemas._avro_object_reader` builds objects instead)."""
        t = self.resolve(t)
        pad = "    " * ind
        out = self.lines.append
        if isinstance(t, str):
            if t in ("int", "long"):
                self.long(target, pad)
                if t == "int":
                    out(f"{pad}if not {-(1 << 31)} <= {target} < {1 << 31}: raise ValueError('int range')")
            elif t in ("string", "bytes"):
                n = self.var("n")
                self.length(n, pad)
                out(f"{pad}e = p + {n}")
                out(f"{pad}if e > DL: raise IndexError('body ends inside a {t}')")
                out(f"{pad}{target} = d[p:e]{'.decode()' if t == 'string' else ''}; p = e")
            elif t == "boolean":
                out(f"{pad}b = d[p]; p += 1")
                out(f"{pad}if b > 1: raise ValueError('boolean byte ' + str(b))")
                out(f"{pad}{target} = b == 1")
            elif t == "double":
                out(f"{pad}if p + 8 > DL: raise IndexError('body ends inside a double')")
                out(f"{pad}{target} = UD(d, p)[0]; p += 8")
            elif t == "null":
                out(f"{pad}{target} = None")
            return
        if isinstance(t, list):
            null, other = _union_branch(t)
            out(f"{pad}b = d[p]; p += 1")
            out(f"{pad}if b == {_SMALL[null][0]}: {target} = None")
            out(f"{pad}elif b == {_SMALL[1 - null][0]}:")
            self.emit(other, target, ind + 1, self.optional(py))
            out(f"{pad}else: raise ValueError('union branch byte ' + str(b))")
            return
        kind = t.get("type")
        if kind == "record":
            self.record(t, py, target, ind)
        elif kind == "enum":
            table, i = self.var("E"), self.var("n")
            self.consts[table] = self.enum_members(t, py)
            self.long(i, pad)
            out(f"{pad}if not 0 <= {i} < {len(t['symbols'])}: raise ValueError('enum index ' + str({i}))")
            out(f"{pad}{target} = {table}[{i}]")
        elif kind in ("array", "map"):
            acc, n, item = self.var("c"), self.var("n"), self.var("i")
            out(f"{pad}{acc} = {'[]' if kind == 'array' else '{}'}")
            out(f"{pad}while True:")
            self.long(n, pad + "    ")
            out(f"{pad}    if {n} == 0: break")
            out(f"{pad}    if {n} < 0: {n} = -{n}; p = SKIP(d, p)")
            out(f"{pad}    for _ in range({n}):")
            if kind == "array":
                self.emit(t["items"], item, ind + 2, self.items(py))
                out(f"{pad}        {acc}.append({item})")
            else:
                k = self.var("k")
                self.emit("string", k, ind + 2)
                self.emit(t["values"], item, ind + 2, self.values(py))
                out(f"{pad}        {acc}[{k}] = {item}")
            out(f"{pad}{target} = {self.array_value(acc) if kind == 'array' else acc}")
        else:
            raise Unsupported(f"type {kind!r}")

    def record(self, t: dict[str, Any], py: Any, target: str, ind: int) -> None:
        fields = []
        for f in t["fields"]:
            v = self.var("f")
            fields.append(f"{f['name']!r}: {v}")
            self.emit(f["type"], v, ind)
        self.lines.append(f"{'    ' * ind}{target} = {{{', '.join(fields)}}}")

    def enum_members(self, t: dict[str, Any], py: Any) -> tuple[Any, ...]:
        """What each symbol's index reads as (here: the symbol)."""
        return tuple(t["symbols"])

    def array_value(self, acc: str) -> str:
        """The expression of an array read into the list ``acc``."""
        return acc

    def optional(self, py: Any) -> Any:
        return None

    def items(self, py: Any) -> Any:
        return None

    def values(self, py: Any) -> Any:
        return None


def _bad(value: Any) -> bytes:
    raise TypeError(f"{value!r} does not match the schema")


class OutOfRange(ValueError):
    """An ``int`` field's value does not fit 32 bits: fastavro would write it, no reader of the
    specification (the generated one included) reads it back, so it is refused."""


def _out_of_range(value: int) -> None:
    raise OutOfRange(f"{value} does not fit an Avro int (32 bits)")


_EncodeGen.globals_ = {"L": write_long, "S": _SMALL, "D": struct.Struct("<d").pack, "T": b"\x01",
                       "F": b"\x00", "Z": b"\x00", "BAD": _bad, "OUT": _out_of_range}
_DecodeGen.globals_ = {"RL": read_long, "SKIP": _skip_block_size, "UD": struct.Struct("<d").unpack_from}


def compile_schema(parsed: Any) -> tuple[Encoder, Decoder]:
    """The generated writer and reader of ``parsed`` (a schema as ``fastavro.parse_schema`` returns
    it, logical types stripped).

    Raises:
        Unsupported: the schema uses a construct outside the generator's subset.
    """
    enc = _EncodeGen()
    enc.lines += ["def encode(rec):", "    parts = []; a = parts.append"]
    enc.emit(parsed, "rec", 1)
    enc.lines.append("    return b''.join(parts)")
    dec = _DecodeGen()
    dec.lines += ["def decode(d, p):", "    DL = len(d)"]
    dec.emit(parsed, "out", 1)
    dec.lines.append("    return out, p")
    return (enc.compiled("encode", f"<avro encoder {parsed.get('name')}>"),
            dec.compiled("decode", f"<avro decoder {parsed.get('name')}>"))
