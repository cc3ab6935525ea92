"""Drains: per ``workflow@version``, its open runs, the runs parked for a member serving it and the
members live for it. What ``runlog versions``, ``runlog doctor``, the console's versions page and the
gauge ``runlog_resumer_open_runs`` show, so a team knows when a version can leave its App: when no
open run of it is left.

A run is *open* while it may still need the code of its version: ``PENDING``, ``RUNNING``,
``WAITING`` (a signal continues it), ``BLOCKED`` (``runlog resolve`` then a resume continues it)
and ``FAILED`` (``runlog retry`` resumes it on its version). ``COMPLETED`` and ``CANCELLED`` runs
need no code.

Open runs are read from the projection (:class:`runlog.projections.RedisStore`): the ids of its status
indexes for :data:`OPEN`, then four fields of each run's state hash (status, workflow,
workflow_version, updated_at), never a snapshot. A run listed by two indexes (between the two steps
of a cluster apply) counts once, under its state's status. While the projection is not marked
ready (a rebuild or a swap moves its indexes) its counts are not the truth: :func:`version_table`
then says why and counts no open run (``runlog versions`` reads the log instead).

The gauge (:class:`OpenRunsGauge`) is refreshed from the resumer's pick-up tick at most every
:data:`OPEN_RUNS_S`. One member counts per period, whichever takes ``P:versions:open_runs:lock``
(``SET NX PX``); it stores the counts as JSON in ``P:versions:open_runs`` and the other members set
their gauges from that, so the group reads the projection once per period whatever its size.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from runlog.processors.resume._versions import VersionRoutes, VersionView, label
from runlog.projections import RedisStore, RunState, RunStatus
from runlog.projections.internal import READY

if TYPE_CHECKING:
    from prometheus_client import Gauge

__all__ = ["OPEN", "OPEN_RUNS_S", "OpenRuns", "OpenRunsGauge", "VersionRow", "open_runs", "open_runs_of",
           "projection_note", "version_rows", "version_table"]

OPEN = ("PENDING", "RUNNING", "WAITING", "BLOCKED", "FAILED")
"""The statuses of open runs (``RunStatus`` values): those that may still need their version's code."""

OPEN_RUNS_S = 10.0
"""How often the open-runs gauge is refreshed (one member counts per period, the others read its count)."""

_CHUNK = 1000


def _text(v: object) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _ms() -> int:
    return int(time.time() * 1000)


@dataclass
class OpenRuns:
    """The open runs of one ``workflow@version``."""

    label: str
    by_status: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPEN, 0))
    oldest_run: str | None = None
    """The open run whose last event is the oldest (the one a drain waits for longest, or a stuck one)."""
    oldest_at: int | None = None
    """That run's last event time (ms)."""

    @property
    def total(self) -> int:
        return sum(self.by_status.values())

    def add(self, status: str, run_id: str, updated_at: int) -> None:
        self.by_status[status] += 1
        if self.oldest_at is None or (updated_at, run_id) < (self.oldest_at, self.oldest_run or ""):
            self.oldest_run, self.oldest_at = run_id, updated_at


def _tally(rows: Iterable[tuple[str, str, str, int]]) -> dict[str, OpenRuns]:
    """``(label, status, run id, updated_at)`` rows of open runs -> their runs per label."""
    out: dict[str, OpenRuns] = {}
    for lbl, status, run_id, updated_at in rows:
        out.setdefault(lbl, OpenRuns(lbl)).add(status, run_id, updated_at)
    return out


def open_runs_of(states: Iterable[RunState]) -> dict[str, OpenRuns]:
    """The open runs among ``states`` (folded from the log, say) per ``workflow@version``."""
    return _tally((label(s.workflow_name, s.workflow_version), s.status.value, s.run_id, s.updated_at)
                  for s in states if s.status.value in OPEN and s.workflow is not None)


def open_runs(store: RedisStore) -> dict[str, OpenRuns]:
    """The open runs of the projection per ``workflow@version`` (module docstring); the caller
    checks that it is ready (:func:`projection_note`)."""
    ids = list(dict.fromkeys(r for s in OPEN for r in store.runs(RunStatus(s))))
    rows: list[tuple[str, str, str, int]] = []
    for i in range(0, len(ids), _CHUNK):
        part = ids[i:i + _CHUNK]
        pipe = store.client.pipeline(transaction=False)
        for run_id in part:
            pipe.hmget(store.state_key(run_id), ["status", "workflow", "workflow_version", "updated_at"])
        for run_id, (status, wf, version, updated) in zip(part, pipe.execute(), strict=True):
            if status is None or wf is None or _text(status) not in OPEN:
                continue  # gone meanwhile (a stale index entry), or not started yet
            rows.append((label(_text(wf), _text(version or "")), _text(status), run_id,
                         int(_text(updated or "0") or 0)))
    return _tally(rows)


def projection_note(store: RedisStore) -> str | None:
    """None when the projection is marked ready, else why its open runs are not counted."""
    marker = store.marker()
    if marker is None:
        return f"no projector has written the projection (prefix {store.prefix!r})"
    if marker.state != READY:
        return (f"the projection (prefix {store.prefix!r}) is marked {marker.state!r}: a rebuild or a "
                "swap is moving it, one stopped midway, or a new projector is replaying the log")
    return None


def _order(lbl: str) -> tuple[str, int, tuple[int, ...], str]:
    """Workflows by name, their versions oldest first (dotted numbers as numbers)."""
    wf, _, version = lbl.rpartition("@")
    try:
        return wf, 0, tuple(int(p) for p in version.split(".")), version
    except ValueError:
        return wf, 1, (), version


@dataclass(frozen=True)
class VersionRow:
    """One ``workflow@version``: its open runs, its parked runs, its live members."""

    label: str
    runs: Mapping[str, int]
    """Open runs by status (every status of :data:`OPEN`)."""
    oldest_run: str | None
    oldest_at: int | None
    waiting: int
    """Runs parked for a member serving it."""
    oldest_waiting_ms: int | None
    members: tuple[str, ...]
    """Live members serving it."""

    @property
    def workflow(self) -> str:
        return self.label.rpartition("@")[0]

    @property
    def version(self) -> str:
        return self.label.rpartition("@")[2]

    @property
    def open(self) -> int:
        return sum(self.runs.values())

    @property
    def drained(self) -> bool:
        """No open run and no parked run: no run needs this version's code any more."""
        return not self.open and not self.waiting

    @property
    def unserved(self) -> bool:
        """Runs need it and no live member serves it."""
        return not self.drained and not self.members

    def counts(self) -> str:
        """``RUNNING 2, FAILED 1``: the statuses it has open runs in."""
        return ", ".join(f"{s} {n}" for s, n in self.runs.items() if n)

    def problem(self) -> str | None:
        """``no live member serves orders@1: ...`` when :attr:`unserved`, else None."""
        if not self.unserved:
            return None
        what = "; ".join(x for x in (self.counts(), f"{self.waiting} parked" if self.waiting else "") if x)
        one = self.open == 1
        return (f"no live member serves {self.label}: {self.open} open run{'' if one else 's'} ({what}) "
                f"wait{'s' if one else ''} until a resumer whose App registers it joins")

    def to_dict(self, now_ms: int | None = None) -> dict[str, Any]:
        now = _ms() if now_ms is None else now_ms
        oldest = None if self.oldest_run is None else {
            "run_id": self.oldest_run, "updated_at": self.oldest_at,
            "age_s": max(0, (now - (self.oldest_at or now)) // 1000)}
        return {"version": self.label, "workflow": self.workflow, "workflow_version": self.version,
                "runs": dict(self.runs), "open": self.open, "oldest_open_run": oldest,
                "parked": self.waiting, "oldest_parked_at": self.oldest_waiting_ms,
                "members": list(self.members), "drained": self.drained, "unserved": self.unserved}


def version_rows(open_by_label: Mapping[str, OpenRuns], views: Iterable[VersionView]) -> list[VersionRow]:
    """One row per ``workflow@version`` with open runs, parked runs or live members (a version
    nobody serves or needs any more is left out), workflows by name, versions oldest first."""
    by_view = {v.label: v for v in views}
    labels = set(open_by_label) | {lbl for lbl, v in by_view.items() if v.members or v.waiting}
    rows = []
    for lbl in sorted(labels, key=_order):
        o, v = open_by_label.get(lbl), by_view.get(lbl)
        rows.append(VersionRow(lbl, dict(o.by_status) if o else dict.fromkeys(OPEN, 0),
                               o.oldest_run if o else None, o.oldest_at if o else None,
                               v.waiting if v else 0, v.oldest_waiting_ms if v else None,
                               v.members if v else ()))
    return rows


def version_table(store: RedisStore,
                  routes: VersionRoutes | None = None) -> tuple[list[VersionRow], str | None]:
    """The rows from the projection and the routing keys, and None; while the projection is not
    ready, rows without open runs (parked runs and members only) and why (:func:`projection_note`)."""
    routes = routes if routes is not None else VersionRoutes(store.client, store.prefix)
    note = projection_note(store)
    return version_rows({} if note else open_runs(store), routes.views()), note


class OpenRunsGauge:
    """Keeps ``gauge`` (labels workflow, version, status) at the projection's open runs, refreshed
    at most every :data:`OPEN_RUNS_S` by :meth:`refresh` (module docstring: one member counts)."""

    def __init__(self, store: RedisStore, gauge: Gauge, member: str) -> None:
        self.store, self.gauge, self.member = store, gauge, member
        self.lock_key = f"{store.prefix}:versions:open_runs:lock"
        self.cache_key = f"{store.prefix}:versions:open_runs"
        self._last = -OPEN_RUNS_S
        self._seen: set[str] = set()

    def counts(self) -> dict[str, dict[str, int]] | None:
        """Open runs by label and status: counted here when this member took the period's lock,
        else the count another member stored; None when there is none (the projection is not
        ready, or the counting member has not stored it yet)."""
        client = self.store.client
        if client.set(self.lock_key, self.member, nx=True, px=int(OPEN_RUNS_S * 1000)):
            if projection_note(self.store) is not None:
                return None
            counts = {lbl: dict(o.by_status) for lbl, o in open_runs(self.store).items()}
            client.set(self.cache_key, json.dumps({"at": _ms(), "by": self.member, "counts": counts}),
                       px=int(6 * OPEN_RUNS_S * 1000))
            return counts
        raw = client.get(self.cache_key)
        if raw is None:
            return None
        got: dict[str, dict[str, int]] = json.loads(raw)["counts"]
        return got

    def refresh(self, force: bool = False) -> bool:
        """Set the gauge when :data:`OPEN_RUNS_S` passed since the last refresh (or ``force``);
        whether it was set. Labels seen before and gone now are set to 0."""
        now = time.monotonic()
        if not force and now - self._last < OPEN_RUNS_S:
            return False
        self._last = now
        counts = self.counts()
        if counts is None:
            return False
        for lbl in sorted(self._seen | set(counts)):
            wf, _, version = lbl.rpartition("@")
            got = counts.get(lbl, {})
            for status in OPEN:
                self.gauge.labels(wf, version, status).set(got.get(status, 0))
        self._seen |= set(counts)
        return True
