"""The agent-side SDK: what an application author writes and calls, on one screen.

Workflows and stages (``Workflow``, ``rule``), tools with replay and retry policies (``tool``,
``ReplayPolicy``, ``RetryPolicy``, ``CallInfo``), the runner and its result (``Runner``,
``RunResult``), the stage context (``StageContext``: ``call``, ``now``, ``random``, ``uuid``,
``wait_for``), the resumer's application object (``App``), input sources, the artifact store
(``load_args`` reads a call's recorded arguments back), settings, and the errors an author
catches. Crash points for testing one's own workflows' crash safety are the public module
:mod:`runlog.producers.crash`. Plumbing (the writer, sessions,
leases, the ledger, key helpers) lives in the private modules and is not part of this surface; what
Runlog's other packages use of it is declared in :mod:`runlog.producers.internal` (not a stable API).

Delivery semantics: events are produced by one idempotent, ``acks=all`` producer
per process, keyed by run id; effect intents are confirmed before the effect,
everything else is confirmed at each stage end (see :mod:`runlog.producers.log._writer`).
"""

from typing import TYPE_CHECKING

from runlog.schemas.internal import lazy_names

if TYPE_CHECKING:
    from runlog.producers.calls._artifacts import ArtifactStore, LocalArtifactStore
    from runlog.producers.calls._calls import WaitTimedOut
    from runlog.producers.calls._stored_args import load_args
    from runlog.producers.define._app import App
    from runlog.producers.define._budget import Budget
    from runlog.producers.define._inputs import (
        DictInputSource,
        InputNotFound,
        InputSource,
        JsonDirInputSource,
    )
    from runlog.producers.define._limits import RateLimit
    from runlog.producers.define._prices import Price, PriceTable
    from runlog.producers.define._queues import Queue
    from runlog.producers.define._schedule import Cron, Schedule
    from runlog.producers.define._tools import (
        CallInfo,
        DeliveryFn,
        ReconcileFn,
        RetryPolicy,
        Tool,
        ToolFn,
        tool,
    )
    from runlog.producers.define._workflow import Rule, Stage, StageFn, Workflow, WorkflowRegistry, rule
    from runlog.producers.run._arunner import AsyncRunner
    from runlog.producers.run._context import (
        AsyncChildRun,
        AsyncStageContext,
        CallPosition,
        ChildRun,
        StageContext,
    )
    from runlog.producers.run._results import RunHandle, RunResult
    from runlog.producers.run._runner import Runner
    from runlog.schemas import ReplayPolicy, Usage
    from runlog.schemas.errors import (
        ArtifactError,
        DeliveryError,
        Diverged,
        EffectInDoubt,
        LeaseLost,
        RateLimited,
        ResumeBlocked,
        RetryableToolError,
        RunCancelled,
        RunConflict,
        RunFailed,
        RunlogError,
        TerminalToolError,
        ToolError,
        VerificationFailed,
        WorkflowDefinitionError,
    )
    from runlog.schemas.settings import Settings


_HOMES: dict[str, tuple[str, ...]] = {
    "runlog.producers.calls._artifacts": ("ArtifactStore", "LocalArtifactStore"),
    "runlog.producers.calls._calls": ("WaitTimedOut",),
    "runlog.producers.calls._stored_args": ("load_args",),
    "runlog.producers.define._app": ("App",),
    "runlog.producers.define._budget": ("Budget",),
    "runlog.producers.define._inputs": (
        "DictInputSource", "InputNotFound", "InputSource", "JsonDirInputSource",
    ),
    "runlog.producers.define._limits": ("RateLimit",),
    "runlog.producers.define._prices": ("Price", "PriceTable"),
    "runlog.producers.define._queues": ("Queue",),
    "runlog.producers.define._schedule": ("Cron", "Schedule"),
    "runlog.producers.define._tools": (
        "CallInfo", "DeliveryFn", "ReconcileFn", "RetryPolicy", "Tool", "ToolFn", "tool",
    ),
    "runlog.producers.define._workflow": (
        "Rule", "Stage", "StageFn", "Workflow", "WorkflowRegistry", "rule",
    ),
    "runlog.producers.run._arunner": ("AsyncRunner",),
    "runlog.producers.run._context": (
        "AsyncChildRun", "AsyncStageContext", "CallPosition", "ChildRun", "StageContext",
    ),
    "runlog.producers.run._results": ("RunHandle", "RunResult"),
    "runlog.producers.run._runner": ("Runner",),
    "runlog.schemas": ("ReplayPolicy", "Usage"),
    "runlog.schemas.errors": (
        "ArtifactError", "DeliveryError", "Diverged", "EffectInDoubt", "LeaseLost", "RateLimited",
        "ResumeBlocked", "RetryableToolError", "RunCancelled", "RunConflict", "RunFailed", "RunlogError",
        "TerminalToolError", "ToolError", "VerificationFailed", "WorkflowDefinitionError",
    ),
    "runlog.schemas.settings": ("Settings",),
}
"""Where each public name is defined: imported on first use (PEP 562), so that importing one of this
package's modules (:mod:`runlog.producers.crash`, say) or the ``runlog`` command line loads no Kafka or
Redis client it does not use, while ``from runlog.producers import Runner`` works as usual."""

__getattr__, __dir__ = lazy_names(
    __name__, {name: module for module, names in _HOMES.items() for name in names})


__all__ = [
    "App",
    "ArtifactError",
    "ArtifactStore",
    "AsyncChildRun",
    "AsyncRunner",
    "AsyncStageContext",
    "Budget",
    "CallInfo",
    "CallPosition",
    "ChildRun",
    "Cron",
    "DeliveryError",
    "DeliveryFn",
    "DictInputSource",
    "Diverged",
    "EffectInDoubt",
    "InputNotFound",
    "InputSource",
    "JsonDirInputSource",
    "LeaseLost",
    "LocalArtifactStore",
    "Price",
    "PriceTable",
    "Queue",
    "RateLimit",
    "RateLimited",
    "ReconcileFn",
    "ReplayPolicy",
    "ResumeBlocked",
    "RetryPolicy",
    "RetryableToolError",
    "Rule",
    "RunCancelled",
    "RunConflict",
    "RunFailed",
    "RunHandle",
    "RunResult",
    "RunlogError",
    "Runner",
    "Schedule",
    "Settings",
    "Stage",
    "StageContext",
    "StageFn",
    "TerminalToolError",
    "Tool",
    "ToolError",
    "ToolFn",
    "Usage",
    "VerificationFailed",
    "WaitTimedOut",
    "Workflow",
    "WorkflowDefinitionError",
    "WorkflowRegistry",
    "load_args",
    "rule",
    "tool",
]
