"""What Runlog's own packages use of the read models beyond their public names: for them, not a stable API.

Budget and usage totals as the fold keeps them, the namespace marker's keys, replica waits. An
application imports :mod:`runlog.projections` instead. The names whose module imports a driver
(Redis) are imported on first use (PEP 562), so importing this module loads none.
"""

from typing import TYPE_CHECKING

from runlog.projections._budget import (
    BUDGET_ATTRIBUTE,
    BUDGET_SIGNAL,
    ON_EXCEEDED,
    SOFT_ATTRIBUTE,
    BudgetCaps,
)
from runlog.projections._marker import READY, marker_key, parse_marker, state_key
from runlog.projections._state import effect_to_dict
from runlog.projections._usage import CHILD_USAGE_ATTRIBUTE, INHERITED_ATTRIBUTE, NO_USAGE, UsageTotals
from runlog.schemas.internal import lazy_names

if TYPE_CHECKING:
    from runlog.projections._marker_store import StandaloneClientOnClusterNode
    from runlog.projections._namespaces import delete_namespace
    from runlog.projections._parallel import WorkerFailed, run_partitioned, split_partitions
    from runlog.projections._replicas import ReplicasBehind, ReplicaWaits

_LAZY = {
    **dict.fromkeys(("ReplicaWaits", "ReplicasBehind"),
                    "runlog.projections._replicas"),
    **dict.fromkeys(("StandaloneClientOnClusterNode",),
                    "runlog.projections._marker_store"),
    **dict.fromkeys(("delete_namespace",),
                    "runlog.projections._namespaces"),
    **dict.fromkeys(("WorkerFailed", "run_partitioned", "split_partitions"),
                    "runlog.projections._parallel"),
}
"""The names whose module imports a driver, by module."""

__getattr__, __dir__ = lazy_names(__name__, _LAZY)


__all__ = [
    "BUDGET_ATTRIBUTE",
    "BUDGET_SIGNAL",
    "CHILD_USAGE_ATTRIBUTE",
    "INHERITED_ATTRIBUTE",
    "NO_USAGE",
    "ON_EXCEEDED",
    "READY",
    "SOFT_ATTRIBUTE",
    "BudgetCaps",
    "ReplicaWaits",
    "ReplicasBehind",
    "StandaloneClientOnClusterNode",
    "UsageTotals",
    "WorkerFailed",
    "delete_namespace",
    "effect_to_dict",
    "marker_key",
    "parse_marker",
    "run_partitioned",
    "split_partitions",
    "state_key",
]
