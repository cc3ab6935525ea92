"""Queues a fleet's workers share, as an App declares them (pure): how many runs of a queue execute at
once across the fleet, how many of one tenant's, and each tenant's weight in the fair share of
starts. Held in Redis by :mod:`runlog.processors.fleet._queues`."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from runlog.schemas.errors import WorkflowDefinitionError

__all__ = ["Queue"]


@dataclass(frozen=True)
class Queue:
    """A queue of submitted runs (``App.of(..., queues=[Queue("default", concurrency=50,
    per_tenant=10, weights={"big": 2})])``).

    Args:
        name: what submissions name (``Client.submit(..., queue=)``; ``default`` unless they say).
        concurrency: runs of this queue executing at once across the whole fleet (None: no cap
            beyond each worker's ``--concurrency``).
        per_tenant: runs of one tenant executing at once across the fleet (None: no cap).
        weights: a tenant's weight in the share of starts while tenants compete (default
            ``default_weight``): a tenant of weight 2 starts twice as many runs as one of weight 1
            while both have runs waiting.
        default_weight: the weight of a tenant ``weights`` does not name.
    """

    name: str
    concurrency: int | None = None
    per_tenant: int | None = None
    weights: Mapping[str, float] = field(default_factory=dict)
    default_weight: float = 1.0

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str) or any(c in self.name for c in "{}|"):
            raise WorkflowDefinitionError(f"a queue needs a name without braces or '|', not {self.name!r}")
        for what, v in (("concurrency", self.concurrency), ("per_tenant", self.per_tenant)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise WorkflowDefinitionError(
                    f"queue {self.name!r}: {what} must be an int >= 1 or None, not {v!r}")
        for tenant, w in {**self.weights, "(default_weight)": self.default_weight}.items():
            if isinstance(w, bool) or not isinstance(w, int | float) or not w > 0:
                raise WorkflowDefinitionError(f"queue {self.name!r}: the weight of {tenant!r} must be a "
                                              f"positive number, not {w!r}")
        object.__setattr__(self, "weights", dict(self.weights))

    def weight(self, tenant: str) -> float:
        return float(self.weights.get(tenant, self.default_weight))
