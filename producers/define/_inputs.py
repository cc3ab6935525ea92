"""Versioned run inputs: an interface, a dict and a JSON-directory adapter, and the pinned view.

A run pins one version per input at ``RUN_STARTED`` (``input_versions``); stages
read inputs only through :class:`PinnedInputs`, so a newer version published
mid-run never leaks into it.
"""

from __future__ import annotations

import abc
import json
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from runlog.schemas.errors import RunlogError

__all__ = ["DictInputSource", "InputNotFound", "InputSource", "JsonDirInputSource", "PinnedInputs"]


class InputNotFound(RunlogError):
    """An input name or version is not available (or not pinned for this run)."""

    def __init__(self, name: str, version: str | None, detail: str) -> None:
        self.name = name
        self.version = version
        super().__init__(f"input {name!r}" + (f" version {version!r}" if version else "") + f": {detail}")


class InputSource(abc.ABC):
    """Where versioned inputs (fact tables, style guides, ...) come from."""

    @abc.abstractmethod
    def get(self, name: str, version: str) -> Any:
        """The value of ``name`` at ``version``; raises InputNotFound."""

    @abc.abstractmethod
    def latest(self, name: str) -> str:
        """The newest version of ``name``; raises InputNotFound."""


class DictInputSource(InputSource):
    """In memory: ``{name: {version: value}}``; latest is the last version inserted
    unless ``latest`` names it."""

    def __init__(self, data: Mapping[str, Mapping[str, Any]],
                 latest: Mapping[str, str] | None = None) -> None:
        self._data = {k: dict(v) for k, v in data.items()}
        self._latest = dict(latest or {})

    def get(self, name: str, version: str) -> Any:
        try:
            return self._data[name][version]
        except KeyError:
            raise InputNotFound(name, version, "not in this source") from None

    def latest(self, name: str) -> str:
        if name in self._latest:
            return self._latest[name]
        versions = list(self._data.get(name, {}))
        if not versions:
            raise InputNotFound(name, None, "no versions")
        return versions[-1]


class JsonDirInputSource(InputSource):
    """Files ``<root>/<name>/<version>.json``; latest is the content of
    ``<root>/<name>/LATEST`` if present, else the greatest version name."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)

    def get(self, name: str, version: str) -> Any:
        path = self.root / name / f"{version}.json"
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise InputNotFound(name, version, f"no file {path}") from None
        except (OSError, ValueError) as err:
            raise InputNotFound(name, version, f"unreadable {path}: {err}") from err

    def latest(self, name: str) -> str:
        d = self.root / name
        marker = d / "LATEST"
        if marker.is_file():
            return marker.read_text(encoding="utf-8").strip()
        versions = sorted(p.stem for p in d.glob("*.json")) if d.is_dir() else []
        if not versions:
            raise InputNotFound(name, None, f"no versions under {d}")
        return versions[-1]


class PinnedInputs:
    """The inputs of one run at the versions pinned in ``RUN_STARTED``."""

    def __init__(self, source: InputSource, versions: Mapping[str, str]) -> None:
        self.source = source
        self.versions: dict[str, str] = dict(versions)

    @classmethod
    def pin(cls, source: InputSource, names: Iterable[str],
            explicit: Mapping[str, str] | None = None) -> PinnedInputs:
        """Pin every name: the explicit version when given, else the source's latest.

        An explicit version is checked to exist, so a run never starts on a typo.
        """
        explicit = dict(explicit or {})
        versions: dict[str, str] = {}
        for n in sorted(set(names) | set(explicit)):
            if n in explicit:
                source.get(n, explicit[n])
                versions[n] = explicit[n]
            else:
                versions[n] = source.latest(n)
        return cls(source, versions)

    def get(self, name: str) -> Any:
        if name not in self.versions:
            raise InputNotFound(name, None, "not pinned for this run")
        return self.source.get(name, self.versions[name])

    def load(self, names: Iterable[str]) -> dict[str, Any]:
        return {n: self.get(n) for n in names}
