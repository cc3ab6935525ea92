"""A generated Avro reader that builds a record's Python object directly (the codec's read path).

:func:`runlog.schemas._avro_gen.compile_schema` reads a record into its Avro dict, which the codec then
turns into the dataclass (:mod:`runlog.schemas._mapping`: every field looked up by name again, enums
converted by value, arrays copied into tuples, nested records converted one by one): about as much
time as reading the bytes. :func:`compile_object_decoder` walks the schema and the dataclass's type
hints together once and writes a function that reads the bytes as the dict reader does (the same
statements for every primitive, union and block) but builds the objects themselves: a record's
fields are set on a new object through its slots (what ``runlog.schemas._plain`` does after reading a
dict), an enum index gives the member from a table made once (``EventType(symbol)`` for each
symbol), an array gives a tuple, a map of strings the dict read.

It gives **the object the dict path gives** (``tests/unit/schemas/test_avro_object_reader.py``
compares them, and fastavro's reading, over generated events of every shape) and fails where the
dict reader fails, with the same exceptions (``IndexError`` on a body that ends early,
``ValueError`` or ``UnicodeDecodeError`` on a malformed one). A class whose fields or hints do
not match the schema (a field missing from the schema, an enum symbol its class does not take, a
union the generator does not take) raises :class:`~runlog.schemas._avro_gen.Unsupported`, and the codec
keeps the dict path. Only a record written with the reader's own schema takes it; the codec uses
it for the bundled ``RunEvent`` only (past schemas are resolved by fastavro, then mapped as before).
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any, ClassVar

from runlog.schemas._avro_gen import Unsupported, _DecodeGen
from runlog.schemas._avro_objects import _items, _optional, _values

__all__ = ["ObjectDecoder", "compile_object_decoder"]

ObjectDecoder = Callable[[bytes, int], tuple[Any, int]]
"""``(data, start)`` -> (the record's Python object, the offset after it)."""


class _ObjectDecodeGen(_DecodeGen):
    """:class:`~runlog.schemas._avro_gen._DecodeGen` building objects where it builds dicts; ``py`` is the
    Python type of the value read (its hint)."""

    globals_: ClassVar[Mapping[str, Any]] = {**_DecodeGen.globals_, "NEW": object.__new__}

    def const(self, prefix: str, value: Any) -> str:
        name = self.var(prefix)
        self.consts[name] = value
        return name

    # each hook reads as the dict reader does where ``py`` is None: a field the class does not have

    def enum_members(self, t: dict[str, Any], py: Any) -> tuple[Any, ...]:
        if py is None:
            return super().enum_members(t, py)
        if not (isinstance(py, type) and issubclass(py, Enum)):
            raise Unsupported(f"enum {t.get('name')!r} is not an Enum ({py!r})")
        try:
            return tuple(py(s) for s in t["symbols"])  # what the dict mapping's ``py(value)`` gives
        except ValueError as err:
            raise Unsupported(f"{py.__name__} does not take every symbol of {t.get('name')!r}") from err

    def array_value(self, acc: str) -> str:
        return f"tuple({acc})"

    def optional(self, py: Any) -> Any:
        return None if py is None else _optional(py)

    def items(self, py: Any) -> Any:
        return None if py is None else _items(py)

    def values(self, py: Any) -> Any:
        return None if py is None else _values(py)

    def record(self, t: dict[str, Any], py: Any, target: str, ind: int) -> None:
        if py is None:
            super().record(t, py, target, ind)
            return
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
                self.emit(f["type"], v, ind, hints[f["name"]])
            else:
                self.emit(f["type"], v, ind)  # a field the class does not have: read, not kept
        if "__slots__" not in py.__dict__ or hasattr(py, "__post_init__"):
            cls = self.const("C", py)
            out(f"{pad}{target} = {cls}({', '.join(f'{n}={values[n]}' for n in names)})")
            return
        # what ``runlog.schemas._plain`` does after reading a dict: a new object, its slots set directly
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
    dec.emit(parsed, "out", 1, cls)
    dec.lines.append("    return out, p")
    fn: ObjectDecoder = dec.compiled("decode", f"<avro object decoder {parsed.get('name')}>")
    return fn
