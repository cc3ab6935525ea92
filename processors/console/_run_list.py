"""The console's run list, from the Redis projection (:class:`runlog.projections.RedisStore`, only read):
one row per run, filtered by status, workflow and a search text, with counts by status, the
runs that wait for a person, and for a run parked for a member serving its version, which version
it waits for (:class:`~runlog.processors.resume._versions.VersionRoutes`, only read)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from runlog.processors.inspect import redact_text
from runlog.processors.resume._versions import VersionRoutes
from runlog.projections import RedisStore, RunState, RunStatus

__all__ = ["ATTENTION", "SCAN_LIMIT", "RunRow", "RunsPage", "list_runs"]

SCAN_LIMIT = 500
"""Newest runs loaded from Redis for one list page (filters and search apply to these): each one's
snapshot is read, and the page refreshes every few seconds."""

ATTENTION = (RunStatus.BLOCKED, RunStatus.WAITING, RunStatus.FAILED)
"""The statuses of runs that wait for a person (resolve or cancel, signal, retry)."""


@dataclass(frozen=True)
class RunRow:
    """One line of the run list."""

    run_id: str
    status: str
    workflow: str
    stage: str
    next_stage: str
    last_seq: int
    epoch: int
    updated_at: int
    reason: str
    """Why the run is blocked or failed (its last error), else empty."""
    open_effects: tuple[str, ...]
    """``tool call_id`` of every effect intent without a result."""
    waiting_for: str
    """The signal a ``WAITING`` run waits for, else empty."""
    version_wait: str = ""
    """``waits for a member serving orders@1 (none live)`` for a run parked for a member serving its
    version (:mod:`runlog.processors.resume._versions`), else empty."""
    tokens: int = 0
    """Input and output tokens of the run's model calls (a branch's inherited ones included)."""
    cost_usd: float | None = None
    """Their cost in US dollars from the App's price table (None: no call had a price)."""
    usage: str = ""
    """The run's model usage in one line (``UsageTotals.describe``), empty without any."""

    @classmethod
    def of(cls, s: RunState, opener: Callable[[str], str] = str) -> RunRow:
        """``s`` as a row; ``opener`` opens a sealed message (a signed-in reader's), one left sealed
        shows ``[sealed]``."""
        err = s.last_error
        reason = redact_text(f"{err.kind}: {opener(err.message)}") if err is not None and s.status in (
            RunStatus.BLOCKED, RunStatus.FAILED, RunStatus.CANCELLED) else ""
        return cls(
            run_id=s.run_id, status=s.status.value,
            workflow=f"{s.workflow_name}@{s.workflow_version}" if s.workflow is not None else "",
            stage=s.stage or "", next_stage=s.next_stage or "", last_seq=s.last_seq, epoch=s.epoch,
            updated_at=s.updated_at, reason=reason,
            open_effects=tuple(f"{e.tool or '?'} {e.call_id or ''}".strip() for e in s.open_intents),
            waiting_for=s.waiting.signal if s.waiting is not None else "",
            tokens=s.total_usage.tokens, cost_usd=s.total_usage.cost,
            usage=s.total_usage.describe() if s.total_usage.calls else "",
        )

    def matches(self, q: str) -> bool:
        """Whether the search text occurs in the run id, workflow, stage, reason or awaited signal."""
        q = q.casefold()
        return any(q in v.casefold() for v in (self.run_id, self.workflow, self.stage, self.next_stage,
                                               self.reason, self.waiting_for, *self.open_effects))


@dataclass(frozen=True)
class RunsPage:
    """A filtered page of the run list, newest first, with counts by status."""

    rows: list[RunRow]
    counts: dict[str, int]
    """Runs per status in the whole projection."""
    scanned: int
    """Runs looked at (the newest :data:`SCAN_LIMIT` of the status asked for)."""
    matched: int
    workflows: list[str]
    """Workflows of the runs looked at (for the filter)."""
    attention: list[RunRow]
    """Blocked, waiting and failed runs: the ones a person has to act on (by status, newest first)."""


def list_runs(store: RedisStore, *, status: str = "", workflow: str = "", q: str = "",
              limit: int = 200, opener: Callable[[str], str] = str) -> RunsPage:
    """The run list from the projection: ``status`` one of :class:`RunStatus` or empty for all,
    ``workflow`` ``name@version`` or a bare name, ``q`` a case-insensitive search text, ``opener``
    what opens a sealed reason (:meth:`RunRow.of`)."""
    st = RunStatus(status) if status else None
    counts = {s.value: n for s, n in store.counts().items()}
    ids = store.runs(st)[::-1][:SCAN_LIMIT]
    states = store.load_states(ids)
    rows = [RunRow.of(states[i], opener) for i in ids if i in states]
    workflows = sorted({r.workflow for r in rows if r.workflow})
    picked = [r for r in rows
              if (not workflow or r.workflow == workflow or r.workflow.split("@", 1)[0] == workflow)
              and (not q or r.matches(q))]
    attention_ids = [i for s in ATTENTION for i in store.runs(s)[-SCAN_LIMIT:]]
    attention = sorted((RunRow.of(s, opener) for s in store.load_states(attention_ids).values()
                        if s.status in ATTENTION),
                       key=lambda r: (ATTENTION.index(RunStatus(r.status)), -r.updated_at))
    shown, attention = _with_version_waits(store, picked[:limit], attention)
    return RunsPage(shown, counts, len(rows), len(picked), workflows, attention)


_PARKABLE = (RunStatus.PENDING.value, RunStatus.RUNNING.value, RunStatus.WAITING.value)


def _with_version_waits(store: RedisStore, *lists: list[RunRow]) -> tuple[list[RunRow], ...]:
    """``lists`` with :attr:`RunRow.version_wait` set for the runs parked for a version's member."""
    ids = list(dict.fromkeys(r.run_id for rs in lists for r in rs if r.status in _PARKABLE))
    waits = VersionRoutes(store.client, store.prefix).waits(ids) if ids else {}
    if not waits:
        return lists
    return tuple([dataclasses.replace(r, version_wait=waits[r.run_id].describe()) if r.run_id in waits else r
                  for r in rs] for rs in lists)
