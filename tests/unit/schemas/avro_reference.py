"""An independent reader of Avro binary bodies, written from the specification, for the codec fuzz tests.

It shares no code with ``runlog.schemas._codec`` or fastavro: it walks the schema JSON and the bytes
itself, so a successful decode by the codec can be checked against what the bytes actually say.
It follows the specification. Two tolerances that mirror fastavro's reader can be switched on
(named, so nothing else is tolerated by accident); both are off, because the codec reads bodies
written with its own schema with the generated reader of :mod:`runlog.schemas._avro_gen`, which follows
the specification:

* ``WRAPS_NEGATIVE_INDEX``: a negative union branch or enum index counts from the end (fastavro
  indexes a Python list with it). The specification makes such bytes invalid.
* ``BOOL_NONZERO_IS_TRUE``: any nonzero boolean byte reads as true (the specification allows 0
  and 1 only).

Bytes that use a tolerance, or a valid but non-canonical form (an overlong varint, a negative
block count with its byte size, more than one block), decode, and :attr:`Reading.canonical` is
False: only a canonical body is the exact encoding of the value read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["BOOL_NONZERO_IS_TRUE", "WRAPS_NEGATIVE_INDEX", "Reading", "Refused", "read_body"]

WRAPS_NEGATIVE_INDEX = False
BOOL_NONZERO_IS_TRUE = False

_INT_RANGE = (-(1 << 31), (1 << 31) - 1)
_LONG_RANGE = (-(1 << 63), (1 << 63) - 1)


class Refused(Exception):
    """The bytes are not a body of the schema; ``reason`` is ``truncated`` or ``invalid_body``."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason


@dataclass
class Reading:
    value: Any
    canonical: bool
    """False when the body used a tolerance or a non-canonical (valid) form."""


class _Reader:
    def __init__(self, data: bytes, names: dict[str, Any]) -> None:
        self.data = data
        self.pos = 0
        self.names = names
        self.canonical = True

    def byte(self) -> int:
        if self.pos >= len(self.data):
            raise Refused("truncated", f"body ends at byte {self.pos}")
        b = self.data[self.pos]
        self.pos += 1
        return b

    def take(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise Refused("truncated", f"{n} bytes wanted at {self.pos}, {len(self.data) - self.pos} left")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out

    def varint(self, bounds: tuple[int, int]) -> int:
        acc, shift, n = 0, 0, 0
        while True:
            b = self.byte()
            n += 1
            acc |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                break
            if n >= 10:
                raise Refused("invalid_body", "varint longer than 10 bytes")
        if n > 1 and b == 0:
            self.canonical = False  # overlong: a zero last group
        value = (acc >> 1) ^ -(acc & 1)
        if not bounds[0] <= value <= bounds[1]:
            raise Refused("invalid_body", f"varint {value} out of range")
        return value

    def length(self) -> int:
        n = self.varint(_LONG_RANGE)
        if n < 0:
            raise Refused("invalid_body", f"negative length {n}")
        return n

    def index(self, n: int, what: str) -> int:
        i = self.varint(_INT_RANGE)
        if 0 <= i < n:
            return i
        if WRAPS_NEGATIVE_INDEX and -n <= i < 0:
            self.canonical = False
            return i + n
        raise Refused("invalid_body", f"{what} index {i} outside 0..{n - 1}")

    def blocks(self) -> int:
        """Item count of the next block of an array or map (0: the end)."""
        count = self.varint(_LONG_RANGE)
        if count < 0:
            self.canonical = False
            self.length()  # the block's size in bytes, which a reader may skip by
            count = -count
        return count

    def read(self, schema: Any) -> Any:
        if isinstance(schema, list):
            return self.read(schema[self.index(len(schema), "union")])
        if isinstance(schema, str):
            return self.primitive(schema)
        t = schema["type"]
        if isinstance(t, dict | list):
            return self.read(t)
        if t == "record":
            return {f["name"]: self.read(f["type"]) for f in schema["fields"]}
        if t == "enum":
            symbols = schema["symbols"]
            return symbols[self.index(len(symbols), "enum")]
        if t in ("array", "map"):
            out: Any = [] if t == "array" else {}
            first = True
            while (count := self.blocks()) != 0:
                if not first:
                    self.canonical = False  # one block is the canonical form
                first = False
                for _ in range(count):
                    if t == "array":
                        out.append(self.read(schema["items"]))
                    else:
                        key = self.string()
                        out[key] = self.read(schema["values"])
            return out
        return self.primitive(t)

    def string(self) -> str:
        raw = self.take(self.length())
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as err:
            raise Refused("invalid_body", f"string is not UTF-8: {err}") from None

    def primitive(self, t: str) -> Any:
        if t == "null":
            return None
        if t == "boolean":
            b = self.byte()
            if b in (0, 1):
                return b == 1
            if BOOL_NONZERO_IS_TRUE:
                self.canonical = False
                return True
            raise Refused("invalid_body", f"boolean byte {b}")
        if t == "int":
            return self.varint(_INT_RANGE)
        if t == "long":
            return self.varint(_LONG_RANGE)
        if t == "string":
            return self.string()
        if t == "bytes":
            return self.take(self.length())
        named = self.names.get(t) or self.names.get(f"runlog.{t}")
        if named is None:
            raise KeyError(f"schema type {t!r} is not defined")
        return self.read(named)


def _names(schema: Any, out: dict[str, Any]) -> dict[str, Any]:
    """Every named type defined anywhere in ``schema`` (a union branch not taken may hold one)."""
    if isinstance(schema, list):
        for s in schema:
            _names(s, out)
    elif isinstance(schema, dict):
        if schema.get("type") in ("record", "enum", "fixed"):
            name = schema["name"]
            out.setdefault(name if "." in name else f"{schema.get('namespace', 'runlog')}.{name}", schema)
        for k in ("type", "items", "values"):
            if k in schema:
                _names(schema[k], out)
        for f in schema.get("fields", ()):
            _names(f["type"], out)
    return out


def read_body(schema: dict[str, Any], body: bytes) -> Reading:
    """Read one value of ``schema`` that must fill ``body`` exactly.

    Raises:
        Refused: the bytes are not such a value (``truncated`` when they end early).
    """
    r = _Reader(body, _names(schema, {}))
    value = r.read(schema)
    if r.pos != len(body):
        raise Refused("invalid_body", f"{len(body) - r.pos} trailing bytes")
    return Reading(value, r.canonical)
