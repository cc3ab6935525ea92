"""A generated Avro reader that builds a record's Python object directly (the codec's read path).

:func:`schemas._avro_gen.compile_schema` reads a record into its Avro dict, which the codec then
turns into the dataclass (:mod:`schemas._mapping`: every field looked up by name again, enums
converted by value, arrays copied into tuples, nested records converted one by one): about as much
time as reading the bytes. :func:`compile_object_decoder` walks the schema and the dataclass's type
hints together once and writes a function that reads the bytes as the dict reader does (the same
statements for every primitive, union and block) but builds the objects themselves: a record's
fields are set on a new object through its slots (what ``schemas._plain`` does after reading a
dict), an enum index gives the member from a table made once (``EventType(symbol)`` for each
symbol), an array gives a tuple, a map of strings the dict read.

It gives **the object the dict path gives** (``tests/unit/schemas/test_avro_object_reader.py``
compares them, and fastavro's reading, over generated events of every shape) and fails where the
dict reader fails, with the same exceptions (``IndexError`` on a body that ends early,
``ValueError`` or ``UnicodeDecodeError`` on a malformed one). A class whose fields or hints do
not match the schema (a field missing from the schema, an enum symbol its class does not take, a
union the generator does not take) raises :class:`~schemas._avro_gen.Unsupported`, and the codec
keeps the dict path. Only a record written with the reader's own schema takes it; the codec uses
it for the bundled ``RunEvent`` only (past schemas are resolved by fastavro, then mapped as before).
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any

from schemas._avro_gen import _SMALL, Unsupported, _DecodeGen, _skip_block_size, _union_branch, read_long
from schemas._avro_objects import _items, _optional, _values

__all__ = ["ObjectDecoder", "compile_object_decoder"]

ObjectDecoder = Callable[[bytes, int], tuple[Any, int]]
"""``(data, start)`` -> (the record's Python object, the offset after it)."""


class _ObjectDecodeGen(_DecodeGen):
    """:class:`~schemas._avro_gen._DecodeGen` building objects where it builds dicts; ``py`` is the
    Python type of the value read (its hint)."""

    def const(self, prefix: str, value: Any) -> str:
        name = self.var(prefix)
        self.consts[name] = value
        return name

    def emit_obj(self, t: Any, py: Any, target: str, ind: int) -> None:
        t = self.resolve(t)
        pad = "    " * ind
        out = self.lines.append
        if isinstance(t, str):
            self.emit(t, target, ind)  # a primitive: read as the dict reader reads it, taken as it is
            return
        if isinstance(t, list):
            null, other = _union_branch(t)
            out(f"{pad}b = d[p]; p += 1")
            out(f"{pad}if b == {_SMALL[null][0]}: {target} = None")
            out(f"{pad}elif b == {_SMALL[1 - null][0]}:")
            self.emit_obj(other, _optional(py), target, ind + 1)
            out(f"{pad}else: raise ValueError('union branch byte ' + str(b))")
            return
        kind = t.get("type")
        if kind == "record":
            self.record(t, py, target, ind)
        elif kind == "enum":
            if not (isinstance(py, type) and issubclass(py, Enum)):
                raise Unsupported(f"enum {t.get('name')!r} is not an Enum ({py!r})")
            try:
                members = tuple(py(s) for s in t["symbols"])  # what the dict mapping's ``py(value)`` gives
            except ValueError as err:
                raise Unsupported(f"{py.__name__} does not take every symbol of {t.get('name')!r}") from err
            table, i = self.const("E", members), self.var("n")
            self.long(i, pad)
            out(f"{pad}if not 0 <= {i} < {len(members)}: raise ValueError('enum index ' + str({i}))")
            out(f"{pad}{target} = {table}[{i}]")
        elif kind in ("array", "map"):
            if kind == "array":
                inner, item_t = _items(py), t["items"]
            else:
                inner, item_t = _values(py), t["values"]
            acc, n, item = self.var("c"), self.var("n"), self.var("i")
            out(f"{pad}{acc} = {'[]' if kind == 'array' else '{}'}")
            out(f"{pad}while True:")
            self.long(n, pad + "    ")
            out(f"{pad}    if {n} == 0: break")
            out(f"{pad}    if {n} < 0: {n} = -{n}; p = SKIP(d, p)")
            out(f"{pad}    for _ in range({n}):")
            if kind == "array":
                self.emit_obj(item_t, inner, item, ind + 2)
                out(f"{pad}        {acc}.append({item})")
            else:
                k = self.var("k")
                self.emit("string", k, ind + 2)
                self.emit_obj(item_t, inner, item, ind + 2)
                out(f"{pad}        {acc}[{k}] = {item}")
            out(f"{pad}{target} = {'tuple(' + acc + ')' if kind == 'array' else acc}")
        else:
            raise Unsupported(f"type {kind!r}")

    def record(self, t: dict[str, Any], py: Any, target: str, ind: int) -> None:
        if not (isinstance(py, type) and dataclasses.is_dataclass(py)):
            raise Unsupported(f"record {t.get('name')!r} is not a dataclass ({py!r})")
        pad = "    " * ind
        out = self.lines.append
        hints = typing.get_type_hints(py)
        names = [f.name for f in dataclasses.fields(py)]
        in_schema = {f["name"] for f in t["fields"]}
        missing = [n for n in names if n not in in_schema]
        if missing:
            raise Unsupported(f"{py.__name__}'s fields {missing} are not in {t.get('name')!r}")
        values: dict[str, str] = {}
        for f in t["fields"]:
            v = self.var("f")
            if f["name"] in hints and f["name"] in names:
                values[f["name"]] = v
                self.emit_obj(f["type"], hints[f["name"]], v, ind)
            else:
                self.emit(f["type"], v, ind)  # a field the class does not have: read, not kept
        if "__slots__" not in py.__dict__ or hasattr(py, "__post_init__"):
            cls = self.const("C", py)
            out(f"{pad}{target} = {cls}({', '.join(f'{n}={values[n]}' for n in names)})")
            return
        # what ``schemas._plain`` does after reading a dict: a new object, its slots set directly
        out(f"{pad}{target} = NEW({self.const('C', py)})")
        for n in names:
            out(f"{pad}{self.const('SET', getattr(py, n).__set__)}({target}, {values[n]})")


def compile_object_decoder(parsed: Any, cls: type) -> ObjectDecoder:
    """The generated reader of ``cls`` objects written with ``parsed`` (a schema as
    ``fastavro.parse_schema`` returns it, logical types stripped).

    Raises:
        Unsupported: the schema uses a construct outside the generator's subset, or ``cls``
            (its fields, their hints, its enums' symbols) does not match it.
    """
    dec = _ObjectDecodeGen()
    dec.lines += ["def decode(d, p):", "    DL = len(d)"]
    dec.emit_obj(parsed, cls, "out", 1)
    dec.lines.append("    return out, p")
    ns: dict[str, Any] = {"RL": read_long, "SKIP": _skip_block_size, "NEW": object.__new__,
                          "UD": struct.Struct("<d").unpack_from, **dec.consts}
    exec(compile("\n".join(dec.lines), f"<avro object decoder {parsed.get('name')}>", "exec"), ns)
    fn: ObjectDecoder = ns["decode"]
    return fn
