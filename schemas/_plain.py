"""Runlog's records as plain values (dicts, lists, str, int, bool, None) and back: the one mapping
between the frozen dataclasses and what an encoder writes (pure: no I/O, no drivers).

A :class:`PlainMapping` reads a dataclass's fields and type hints once and generates a pair of
functions for it (the field loop unrolled, like a hand-written mapping but from one source). The
types it knows: ``str``, ``int``, ``float``, ``bool``, ``bytes``; enums (by value); nested
dataclasses; ``X | None``; ``tuple[X, ...]`` and fixed tuples (as lists); ``Mapping[str, X]`` (as
objects). How a mapping writes records is its style:

* the Avro style (:data:`runlog.schemas._mapping.AVRO`): every record an object of all its fields, the
  shape fastavro reads and writes, every field present when read (``complete``);
* the projection's JSON style (``runlog.projections._state``): some small records as lists of their
  field values in field order (``positional``), some maps of records as lists sorted by key
  (``keyed``), fields added later read as their default when absent.

Reading takes the values as they are (no coercion, no copy of maps): the input is freshly decoded
and owned by the result.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from enum import Enum
from typing import Any

__all__ = ["PlainMapping"]

_SCALARS = (str, int, float, bool, bytes, type(None))
_MISSING: Any = object()


class PlainMapping:
    """Dataclasses to plain values and back, in one style; functions generated once per class.

    Args:
        positional: record classes written as a list of their field values in field order;
            trailing items absent when read take the fields' defaults.
        keyed: ``(owner class, field name) -> key field``: a ``Mapping[str, record]`` field written
            as the list of its values sorted by key, read back keyed by each value's key field.
        complete: read every field with ``[name]`` (the input has them all, as fastavro gives with
            a reader schema); otherwise a field with a default takes it when absent.
    """

    def __init__(
        self,
        *,
        positional: Iterable[type] = (),
        keyed: Mapping[tuple[type, str], str] | None = None,
        complete: bool = False,
    ) -> None:
        self._positional = frozenset(positional)
        self._keyed = dict(keyed or {})
        self._complete = complete
        self._to: dict[tuple[type, frozenset[str]], Callable[[Any], Any]] = {}
        self._from: dict[type, Callable[[Any], Any]] = {}

    # -- public ------------------------------------------------------------------------------------

    def to_plain(self, cls: type, *, omit: Iterable[str] = (),
                 extra: Mapping[str, Any] | None = None) -> Callable[[Any], Any]:
        """The function writing a ``cls`` record as a plain value. ``omit`` leaves fields out and
        ``extra`` adds constant keys (dict style only; the first call for a class and ``omit``
        decides the extras)."""
        key = (cls, frozenset(omit))
        fn = self._to.get(key)
        if fn is None:
            fn = self._to[key] = self._gen_to(cls, key[1], dict(extra or {}))
        return fn

    def field_to_plain(self, cls: type, name: str) -> Callable[[Any], Any]:
        """The function writing the value of ``cls``'s field ``name`` as a plain value, as
        :meth:`to_plain` writes it under its key (for a writer that assembles a record's parts)."""
        hints = typing.get_type_hints(cls)
        if name not in _field_names(cls):
            raise TypeError(f"{cls.__name__} has no field {name!r}")
        ns: dict[str, Any] = {}
        if (cls, name) in self._keyed:
            value_type = _mapping_value(hints[name], cls, name)
            item = self._to_expr(value_type, "_v", ns) or "_v"
            expr = f"[{item} for _, _v in sorted(x.items())]"
        else:
            expr = self._to_expr(hints[name], "x", ns) or "x"
        return _compile(f"def _field(x):\n    return {expr}\n", ns, "_field")

    def from_plain(self, cls: type) -> Callable[[Any], Any]:
        """The function reading a ``cls`` record back from its plain value."""
        fn = self._from.get(cls)
        if fn is None:
            fn = self._from[cls] = self._gen_from(cls)
        return fn

    # -- generation --------------------------------------------------------------------------------

    def _gen_to(self, cls: type, omit: frozenset[str], extra: dict[str, Any]) -> Callable[[Any], Any]:
        hints = typing.get_type_hints(cls)
        ns: dict[str, Any] = {}
        names = _field_names(cls)
        unknown = omit.difference(names)
        if unknown:
            raise TypeError(f"{cls.__name__} has no field {sorted(unknown)}")
        parts = []
        for name in names:
            if name in omit:
                continue
            keyed = self._keyed.get((cls, name))
            if keyed is not None:
                value_type = _mapping_value(hints[name], cls, name)
                item = self._to_expr(value_type, "_v", ns) or "_v"
                expr = f"[{item} for _, _v in sorted(o.{name}.items())]"
            else:
                expr = self._to_expr(hints[name], f"o.{name}", ns) or f"o.{name}"
            parts.append((name, expr))
        if cls in self._positional:
            if extra:
                raise TypeError(f"{cls.__name__} is positional: no extra keys")
            body = "[" + ", ".join(e for _, e in parts) + "]"
        else:
            for i, v in enumerate(extra.values()):
                ns[f"_extra{i}"] = v
            items = [f"{k!r}: _extra{i}" for i, k in enumerate(extra)] + [f"{n!r}: {e}" for n, e in parts]
            body = "{" + ", ".join(items) + "}"
        return _compile(f"def _to(o):\n    return {body}\n", ns, "_to")

    def _gen_from(self, cls: type) -> Callable[[Any], Any]:
        hints = typing.get_type_hints(cls)
        ns: dict[str, Any] = {"_cls": cls, "_M": _MISSING}
        positional = cls in self._positional
        every: list[str] = []  # reading each field as present
        tolerant: list[str] = []  # a field with a default takes it when absent
        args = []
        for i, f in enumerate(dataclasses.fields(cls)):
            name, var = f.name, f"_a{i}"
            keyed = self._keyed.get((cls, name))
            if keyed is not None:
                value_type = _mapping_value(hints[name], cls, name)
                conv = self._from_expr(value_type, "_v", ns) or "_v"
                key = f"_v[{keyed!r}]" if value_type not in self._positional else \
                    f"_v[{_field_names(value_type).index(keyed)}]"
                make = "{" + f"{key}: {conv} for _v in _x" + "}"
            else:
                make = self._from_expr(hints[name], "_x", ns) or "_x"
            source = f"d[{i}]" if positional else f"d[{name!r}]"
            present = [f"{var} = {source}"] if make == "_x" else [f"_x = {source}", f"{var} = {make}"]
            every += present
            default = _default_of(f)
            if default is _MISSING:
                tolerant += present
            else:
                ns[f"_d{i}"] = default
                fill = f"_d{i}()" if f.default is dataclasses.MISSING else f"_d{i}"
                if positional:
                    tolerant += [f"if _n > {i}:", *("    " + p for p in present), f"else: {var} = {fill}"]
                elif make == "_x" and f.default is not dataclasses.MISSING:
                    tolerant.append(f"{var} = d.get({name!r}, _d{i})")
                else:
                    tolerant += [f"_x = d.get({name!r}, _M)", f"{var} = {fill} if _x is _M else {make}"]
            args.append(var)
        ret = _construct(cls, args, ns)
        if self._complete and not positional:
            body = [*every, *ret]
        elif positional:
            body = ["_n = len(d)", *tolerant, *ret]
        else:  # the common case first: every field there (one subset test), else defaults
            ns["_keys"] = frozenset(_field_names(cls))
            body = ["if _keys <= d.keys():", *("    " + p for p in [*every, *ret]), *tolerant, *ret]
        return _compile("def _from(d):\n" + "".join(f"    {line}\n" for line in body), ns, "_from")

    def _to_expr(self, t: Any, x: str, ns: dict[str, Any]) -> str | None:
        """An expression writing ``x`` of type ``t``, or None when ``x`` is written as it is."""
        return self._expr(t, x, ns, writing=True)

    def _from_expr(self, t: Any, x: str, ns: dict[str, Any]) -> str | None:
        """An expression reading ``x`` back as type ``t``, or None when ``x`` is taken as it is."""
        return self._expr(t, x, ns, writing=False)

    def _expr(self, t: Any, x: str, ns: dict[str, Any], *, writing: bool) -> str | None:
        if t is Any or t in _SCALARS:
            return None
        if isinstance(t, type) and issubclass(t, Enum):
            return f"{x}.value" if writing else f"{_bind(ns, '_enum_', t)}({x})"
        if dataclasses.is_dataclass(t) and isinstance(t, type):
            fn = self.to_plain(t) if writing else self.from_plain(t)
            return f"{_bind(ns, '_rec_', fn)}({x})"
        inner = _optional(t)
        if inner is not None:
            e = self._expr(inner, x, ns, writing=writing)
            return None if e is None else f"(None if {x} is None else {e})"
        origin, args = typing.get_origin(t), typing.get_args(t)
        seq = "list" if writing else "tuple"
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            v = _fresh(ns)
            e = self._expr(args[0], v, ns, writing=writing)
            if e is None:
                return f"{seq}({x})"
            comp = f"[{e} for {v} in {x}]"
            return comp if writing else f"tuple({comp})"
        if origin is tuple:
            es = [self._expr(a, f"{x}[{i}]", ns, writing=writing) for i, a in enumerate(args)]
            if all(e is None for e in es):
                return f"{seq}({x})"
            items = "[" + ", ".join(e or f"{x}[{i}]" for i, e in enumerate(es)) + "]"
            return items if writing else f"tuple({items})"
        if origin in (Mapping, dict, typing.Mapping):
            v = _fresh(ns)
            e = self._expr(args[1], v, ns, writing=writing)
            if e is None:  # written as a fresh dict; read as decoded (the reader owns it)
                return f"dict({x})" if writing else None
            return "{" + f"_k: {e} for _k, {v} in {x}.items()" + "}"
        raise TypeError(f"no plain mapping for {t!r}")


def _construct(cls: type, args: list[str], ns: dict[str, Any]) -> list[str]:
    """Lines returning a new ``cls`` from the field values in ``args`` (field order). A slots
    dataclass without ``__post_init__`` gets its slots set directly (what its ``__init__`` does,
    without a frozen class's ``object.__setattr__`` per field, about twice as fast); others are
    called."""
    names = _field_names(cls)
    if "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__"):
        return [f"return _cls({', '.join(args)})"]
    ns["_new"] = object.__new__
    lines = ["_o = _new(_cls)"]
    for i, (name, arg) in enumerate(zip(names, args, strict=True)):
        ns[f"_set{i}"] = getattr(cls, name).__set__
        lines.append(f"_set{i}(_o, {arg})")
    return [*lines, "return _o"]


def _field_names(cls: type) -> list[str]:
    names = [f.name for f in dataclasses.fields(cls)]
    bad = [n for n in names if not n.isidentifier() or n.startswith("_")]
    if bad:
        raise TypeError(f"no generated mapping for {cls.__name__}: field names {bad}")
    return names


def _default_of(f: dataclasses.Field[Any]) -> Any:
    if f.default is not dataclasses.MISSING:
        return f.default
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory
    return _MISSING


def _optional(t: Any) -> Any:
    """``X`` for ``X | None`` (or ``Optional[X]``), else None."""
    if typing.get_origin(t) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(t) if a is not type(None)]
        if len(args) == 1 and len(typing.get_args(t)) == 2:
            return args[0]
    return None


def _mapping_value(t: Any, cls: type, name: str) -> Any:
    if typing.get_origin(t) not in (Mapping, dict, typing.Mapping):
        raise TypeError(f"{cls.__name__}.{name} is keyed but not a mapping: {t!r}")
    return typing.get_args(t)[1]


def _fresh(ns: dict[str, Any]) -> str:
    n = ns["_vars"] = ns.get("_vars", 0) + 1
    return f"_i{n}"


def _bind(ns: dict[str, Any], prefix: str, value: Any) -> str:
    for k, v in ns.items():
        if k.startswith(prefix) and v is value:
            return k
    name = f"{prefix}{sum(1 for k in ns if k.startswith(prefix))}"
    ns[name] = value
    return name


def _compile(source: str, ns: dict[str, Any], name: str) -> Callable[[Any], Any]:
    exec(compile(source, f"<plain {name}>", "exec"), ns)  # generated from the class's own fields
    fn: Callable[[Any], Any] = ns[name]
    fn.__doc__ = source
    return fn
