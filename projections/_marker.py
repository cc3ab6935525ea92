"""The names a projection namespace is found by: a run's state key and the namespace marker, and
the marker's reading. Shared by the store and by writers that ask whether a run is projected
(:meth:`runlog.producers.run._runs.RunKeys.known`); no driver is imported here."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["READY", "REBUILDING", "REPLAYING", "WRITABLE", "Marker", "marker_key", "parse_marker",
           "state_key"]

READY, REBUILDING, REPLAYING = "ready", "rebuilding", "replaying"
"""``ready``: the namespace holds every event up to what the projector consumed. ``rebuilding``: a
rebuild from the log runs (applies are refused). ``replaying``: a projector group with no committed
offsets started on a topic that already held events and is consuming it from the start; it writes,
but the namespace is not whole until the group's commits reach the high watermarks it started at
(the marker's ``until`` field), so readers must not take a missing run for an unknown one."""

WRITABLE = (READY, REPLAYING)
"""The marker states a projector writes under."""


@dataclass(frozen=True)
class Marker:
    """The namespace marker: which incarnation of the namespace this is, and whether it is whole."""

    gen: str
    state: str


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def state_key(prefix: str, run_id: str) -> str:
    """A run's projected state (hash-tagged by run id)."""
    return f"{prefix}:{{{run_id}}}:state"


def marker_key(prefix: str) -> str:
    """The namespace marker of ``prefix``."""
    return f"{prefix}:projection"


def parse_marker(raw: Mapping[Any, Any] | None) -> Marker | None:
    """The marker from its hash's fields (``HGETALL``), or None when it has no generation."""
    fields = {_text(k): _text(v) for k, v in (raw or {}).items()}
    if "gen" not in fields:
        return None
    return Marker(fields["gen"], fields.get("state", READY))
