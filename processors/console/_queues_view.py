"""The console's view of what waits in a fleet (``runlog queues`` and more): every queue of the
prefix with its pending and running runs per tenant, and the runs waiting durably for a rate limit
(``WAITING`` for ``runlog.limit``, from the projection). Read-only, like the rest of the console."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from runlog.processors.fleet._queues import QueueStats, all_queues
from runlog.producers.internal import LIMIT
from runlog.projections import RedisStore, RunStatus

__all__ = ["FleetWaits", "LimitWait", "fleet_waits"]

SCAN = 2000
"""The newest ``WAITING`` runs looked at for rate-limit waits."""


@dataclass(frozen=True)
class LimitWait:
    """A run waiting durably for a call's rate limit."""

    run_id: str
    workflow: str
    call_id: str
    until_ms: int
    since_ms: int

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "workflow": self.workflow, "call_id": self.call_id,
                "until_ms": self.until_ms, "since_ms": self.since_ms}


@dataclass(frozen=True)
class FleetWaits:
    queues: list[QueueStats]
    limit_waits: list[LimitWait]

    def to_dict(self) -> dict[str, Any]:
        return {"queues": [q.to_dict() for q in self.queues],
                "limit_waits": [w.to_dict() for w in self.limit_waits]}


def fleet_waits(store: RedisStore) -> FleetWaits:
    """The queues under the store's prefix and the runs waiting for a rate limit (soonest first)."""
    queues = sorted(all_queues(store.client, store.prefix), key=lambda q: q.tag)
    ids = store.runs(RunStatus.WAITING)[-SCAN:]
    waits = []
    for s in store.load_states(ids).values():
        w = s.waiting
        if s.status is RunStatus.WAITING and w is not None and w.signal == LIMIT:
            wf = f"{s.workflow_name}@{s.workflow_version}" if s.workflow is not None else ""
            waits.append(LimitWait(s.run_id, wf, w.call_id, w.deadline_ms, w.since_ms))
    return FleetWaits(queues, sorted(waits, key=lambda w: (w.until_ms, w.run_id)))
