"""A generated Avro writer that reads a record's Python object directly (the codec's write path).

:func:`runlog.schemas._avro_gen.compile_schema` writes a record from its Avro dict, so an append first
builds that dict (:mod:`runlog.schemas._mapping`: every field, nested records, enums by value, tuples as
lists, maps copied): a tenth of an append's time on the write path. :func:`compile_object_encoder`
walks the schema and the dataclass's type hints together once and writes a function that reads
the object's attributes where the dict writer reads keys (``ev.stage`` for ``rec['stage']``),
iterates its tuples and mappings as they are, and reads an enum member's value from its
``_value_`` (not the ``value`` property). Its statements are otherwise the dict writer's, so it
writes **the same bytes** (``tests/unit/schemas/test_avro_objects.py`` compares them with
fastavro's for generated events) and fails where that would: a value of the wrong type raises
``TypeError``, ``AttributeError`` or ``KeyError`` (the codec then takes the dict path, so
behaviour on bad input is unchanged), an ``int`` outside 32 bits
:class:`~runlog.schemas._avro_gen.OutOfRange`.

A class whose fields or hints do not match the schema (a field missing, an enum that is not an
``Enum``, a union the generator does not take) raises :class:`~runlog.schemas._avro_gen.Unsupported`, and
the codec keeps the dict path for it. The codec uses it for the bundled ``RunEvent`` only.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Mapping
from enum import Enum
from typing import Any

from runlog.schemas._avro_gen import Unsupported, _EncodeGen

__all__ = ["ObjectEncoder", "compile_object_encoder"]

ObjectEncoder = Callable[[Any], bytes]
"""A record's Python object -> its Avro binary body."""


def _optional(py: Any) -> Any:
    """``X`` of ``X | None``."""
    if typing.get_origin(py) in (typing.Union, types.UnionType):
        args = typing.get_args(py)
        if len(args) == 2 and type(None) in args:
            return args[0] if args[1] is type(None) else args[1]
    raise Unsupported(f"{py!r} is not X | None")


def _items(py: Any) -> Any:
    """``X`` of ``tuple[X, ...]``."""
    args = typing.get_args(py)
    if typing.get_origin(py) is tuple and len(args) == 2 and args[1] is Ellipsis:
        return args[0]
    raise Unsupported(f"{py!r} is not tuple[X, ...]")


def _values(py: Any) -> Any:
    """``X`` of ``Mapping[str, X]``."""
    args = typing.get_args(py)
    if typing.get_origin(py) in (Mapping, dict) and len(args) == 2 and args[0] is str:
        return args[1]
    raise Unsupported(f"{py!r} is not Mapping[str, X]")


class _ObjectEncodeGen(_EncodeGen):
    """:class:`~runlog.schemas._avro_gen._EncodeGen` reading attributes where it reads keys; ``py`` is the
    Python type of the value written (its hint)."""

    def record(self, t: dict[str, Any], py: Any, expr: str, ind: int) -> None:
        if not (isinstance(py, type) and dataclasses.is_dataclass(py)):
            raise Unsupported(f"record {t.get('name')!r} is not a dataclass ({py!r})")
        hints = typing.get_type_hints(py)
        r = self.var("r")
        self.lines.append(f"{'    ' * ind}{r} = {expr}")
        for f in t["fields"]:
            name = f["name"]
            if name not in hints or not name.isidentifier():
                raise Unsupported(f"{py.__name__} has no field {name!r}")
            self.emit(f["type"], f"{r}.{name}", ind, hints[name])

    def enum_value(self, t: dict[str, Any], py: Any, expr: str) -> str:
        if not (isinstance(py, type) and issubclass(py, Enum)):
            raise Unsupported(f"enum {t.get('name')!r} is not an Enum ({py!r})")
        # the member's value as the dict mapping's ``.value`` gives it, without the property
        # (anything else, a plain string too, has no ``_value_``: the codec takes the dict path)
        return f"{expr}._value_"

    def optional(self, py: Any) -> Any:
        return _optional(py)

    def items(self, py: Any) -> Any:
        return _items(py)

    def values(self, py: Any) -> Any:
        return _values(py)


def compile_object_encoder(parsed: Any, cls: type) -> ObjectEncoder:
    """The generated writer of ``cls`` objects under ``parsed`` (a schema as
    ``fastavro.parse_schema`` returns it, logical types stripped), reading their attributes.

    Raises:
        Unsupported: the schema uses a construct outside the generator's subset, or ``cls``
            (its fields, their hints) does not match it.
    """
    enc = _ObjectEncodeGen()
    enc.lines += ["def encode(rec):", "    parts = []; a = parts.append"]
    enc.emit(parsed, "rec", 1, cls)
    enc.lines.append("    return b''.join(parts)")
    fn: ObjectEncoder = enc.compiled("encode", f"<avro object encoder {parsed.get('name')}>")
    return fn
