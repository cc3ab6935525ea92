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

from runlog.producers.calls._artifacts import ArtifactStore, LocalArtifactStore
from runlog.producers.calls._calls import WaitTimedOut
from runlog.producers.calls._stored_args import load_args
from runlog.producers.define._app import App
from runlog.producers.define._budget import Budget
from runlog.producers.define._inputs import DictInputSource, InputNotFound, InputSource, JsonDirInputSource
from runlog.producers.define._limits import RateLimit
from runlog.producers.define._prices import Price, PriceTable
from runlog.producers.define._queues import Queue
from runlog.producers.define._schedule import Cron, Schedule
from runlog.producers.define._tools import CallInfo, DeliveryFn, ReconcileFn, RetryPolicy, Tool, ToolFn, tool
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
