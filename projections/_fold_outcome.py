"""What folding one event did (:class:`Outcome`), and the fold's bounds (part of
:mod:`runlog.projections.fold`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from runlog.projections._state import EffectEntry
from runlog.schemas import Checkpoint, Usage

__all__ = ["CHECKPOINT_WINDOW", "DIGEST_WINDOW", "REJECTED_WINDOW", "LimitUse", "Outcome", "OutcomeKind",
           "Position"]

DIGEST_WINDOW = 64
REJECTED_WINDOW = 32
CHECKPOINT_WINDOW = 64

Position = tuple[int, int]
"""(partition, offset) of a record on the events topic."""


class OutcomeKind(StrEnum):
    ACCEPTED = "accepted"
    DUPLICATE = "duplicate"
    REJECTED_FENCED = "rejected_fenced"
    REJECTED_OUT_OF_ORDER = "rejected_out_of_order"


@dataclass(frozen=True, slots=True)
class LimitUse:
    """A call's dealings with its rate limit as the log records them: a ``TOOL_RESULT`` with attribute
    ``limit`` (``waited_ms``: ``limit_wait_ms``, ``refusals``: ``rate_limited``), or a durable wait
    beginning (``RUN_WAITING`` for signal ``runlog.limit``: ``parked``)."""

    key: str
    waited_ms: int = 0
    refusals: int = 0
    parked: bool = False


@dataclass(frozen=True, slots=True)
class Outcome:
    """What folding one event did, and what it produced for the compacted topics."""

    kind: OutcomeKind
    reason: str | None = None
    checkpoint: Checkpoint | None = None
    effects: tuple[EffectEntry, ...] = field(default=())
    usage: Usage | None = None
    """What an accepted ``TOOL_RESULT`` recorded as spent (counted once: a duplicate is not accepted)."""
    limit: LimitUse | None = None
    """What an accepted event says of a call's rate limit (counted once, like ``usage``)."""

    @property
    def accepted(self) -> bool:
        return self.kind is OutcomeKind.ACCEPTED

    @property
    def rejected(self) -> bool:
        return self.kind in (OutcomeKind.REJECTED_FENCED, OutcomeKind.REJECTED_OUT_OF_ORDER)


_ACCEPTED = Outcome(OutcomeKind.ACCEPTED)
