"""A ``RunEvent`` built the way its ``__init__`` builds it, at a third of the cost (pure).

``RunEvent`` is a frozen slots dataclass: its generated ``__init__`` sets each of its fields
through ``object.__setattr__``, a seventh of an append's time on the write path. :data:`new_event`
is generated once from the class's own fields with the same signature (the same names, defaults
and default factories; an unknown keyword is a ``TypeError`` as before) and sets the slots through
their descriptors directly. A class with a ``__post_init__`` (a check at construction) is called
as it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from runlog.schemas import RunEvent

__all__ = ["constructor", "new_event"]


def constructor(cls: type) -> Callable[..., Any]:
    """``cls(...)`` for a frozen slots dataclass, generated as above (``cls`` itself when it has a
    ``__post_init__`` or no slots)."""
    if hasattr(cls, "__post_init__") or "__slots__" not in cls.__dict__:
        return cls
    ns: dict[str, Any] = {"_new": object.__new__, "_cls": cls, "_MISSING": object()}
    params: list[str] = []
    body = ["    _o = _new(_cls)"]
    keyword_only = False
    for i, f in enumerate(dataclasses.fields(cls)):
        if not f.init:
            raise TypeError(f"{cls.__name__}.{f.name} is not an __init__ field")
        ns[f"_set{i}"] = getattr(cls, f.name).__set__
        if f.default is not dataclasses.MISSING:
            ns[f"_d{i}"] = f.default
            params.append(f"{f.name}=_d{i}")
            body.append(f"    _set{i}(_o, {f.name})")
        elif f.default_factory is not dataclasses.MISSING:
            ns[f"_f{i}"] = f.default_factory
            params.append(f"{f.name}=_MISSING")
            body.append(f"    _set{i}(_o, _f{i}() if {f.name} is _MISSING else {f.name})")
        else:
            if keyword_only:
                raise TypeError(f"{cls.__name__}.{f.name}: a field without a default after one with")
            params.append(f.name)
            body.append(f"    _set{i}(_o, {f.name})")
        keyword_only = keyword_only or f.default is not dataclasses.MISSING \
            or f.default_factory is not dataclasses.MISSING
    source = "\n".join([f"def {cls.__name__}({', '.join(params)}):", *body, "    return _o"])
    exec(compile(source, f"<new {cls.__name__}>", "exec"), ns)  # generated from the class's own fields
    fn: Callable[..., Any] = ns[cls.__name__]
    return fn


new_event: Callable[..., RunEvent] = constructor(RunEvent)
"""``RunEvent(...)``, same arguments, same result."""
