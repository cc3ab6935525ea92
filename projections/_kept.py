"""The updates of a batch not yet whole, kept and sent again ahead of the next apply's.

A batch that raised may have written part of itself (on Redis Cluster the run's step and not its
indexes, or, anywhere, all of it without the replicas' acknowledgement); the projector then folds the
batch again from the store, where those runs already hold it: duplicates, no update, nothing written or
waited for. Sending the kept updates again completes them: their run scripts answer ALREADY (nothing
written) or APPLIED (the write was lost), their index writes are idempotent and run for both, and the
pipelines wait for replicas again. A lost namespace drops them: it is rebuilt from the log.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from runlog.projections._sharded import ProjectionLost
from runlog.projections.store import ApplyResult, RunUpdate

__all__ = ["KeptBatch"]


class KeptBatch:
    """The updates of the last batch that did not complete (see the module docstring)."""

    def __init__(self) -> None:
        self.updates: list[RunUpdate] = []
        """The kept updates; empty once a batch completed, or its namespace was lost."""

    def apply(self, updates: Sequence[RunUpdate],
              once: Callable[[Sequence[RunUpdate]], list[ApplyResult]]) -> list[ApplyResult]:
        """``once`` on the kept updates (a batch that raised anything but :class:`ProjectionLost`),
        then ``updates``, in one go; the results of ``updates``."""
        batch: list[RunUpdate] = []
        at: dict[tuple[str, int, int], int] = {}
        for u in [*self.updates, *updates]:  # a retry re-folds the same updates: send each once
            k = (u.run_id, u.base_offset, u.state.offset)
            if k not in at:
                at[k] = len(batch)
                batch.append(u)
        if not batch:
            return []
        self.updates = batch
        try:
            results = once(batch)
        except ProjectionLost:
            self.updates = []
            raise
        self.updates = []
        return [results[at[(u.run_id, u.base_offset, u.state.offset)]] for u in updates]
