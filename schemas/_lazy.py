"""Names a module imports on first use (PEP 562): how a package keeps a driver (Kafka, Redis,
fastavro) out of its own import while still exporting the names that need one."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_names"]


def lazy_names(module: str, table: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module-level ``__getattr__`` and ``__dir__`` of ``module`` (the one being executed) for
    the names of ``table`` (name -> the module that defines it): a name is imported on first use
    and kept in ``module``'s namespace, so later uses are plain lookups."""
    namespace = sys.modules[module].__dict__

    def get(name: str) -> Any:
        where = table.get(name)
        if where is None:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where), name)
        namespace[name] = value
        return value

    def names() -> list[str]:
        return sorted(set(namespace) | set(table))

    return get, names
