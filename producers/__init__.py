"""The agent-side SDK: what an application author writes and calls, on one screen.

Workflows and stages (``Workflow``, ``rule``), tools with replay and retry policies (``tool``,
``ReplayPolicy``, ``RetryPolicy``, ``CallInfo``), the runner and its result (``Runner``,
``RunResult``), the stage context (``StageContext``: ``call``, ``now``, ``random``, ``uuid``,
``wait_for``), the resumer's application object (``App``), input sources, the artifact store
(``load_args`` reads a call's recorded arguments back), settings, and the errors an author
catches. Crash points for testing one's own workflows' crash safety are the public module
:mod:`producers.crash`. Plumbing (the writer, sessions,
leases, the ledger, key helpers) lives in the private modules and is not part of this surface.

Delivery semantics: events are produced by one idempotent, ``acks=all`` producer
per process, keyed by run id; effect intents are confirmed before the effect,
everything else is confirmed at each stage end (see :mod:`producers.log._writer`).
"""

from producers.calls._artifacts import ArtifactStore, LocalArtifactStore
from producers.calls._calls import WaitTimedOut
from producers.calls._stored_args import load_args
from producers.define._app import App
from producers.define._budget import Budget
from producers.define._inputs import DictInputSource, InputNotFound, InputSource, JsonDirInputSource
from producers.define._prices import Price, PriceTable
from producers.define._tools import CallInfo, DeliveryFn, ReconcileFn, RetryPolicy, Tool, ToolFn, tool
from producers.define._workflow import Rule, Stage, StageFn, Workflow, WorkflowRegistry, rule
from producers.run._arunner import AsyncRunner
from producers.run._context import AsyncStageContext, CallPosition, StageContext
from producers.run._core import RunResult
from producers.run._runner import Runner
from producers.run._start import RunHandle
from schemas._types import ReplayPolicy, Usage
from schemas.errors import (
    ArtifactError,
    DeliveryError,
    Diverged,
    EffectInDoubt,
    LeaseLost,
    ResumeBlocked,
    RetryableToolError,
    RunConflict,
    RunlogError,
    TerminalToolError,
    ToolError,
    VerificationFailed,
    WorkflowDefinitionError,
)
from schemas.settings import Settings

__all__ = [
    "App",
    "ArtifactError",
    "ArtifactStore",
    "AsyncRunner",
    "AsyncStageContext",
    "Budget",
    "CallInfo",
    "CallPosition",
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
    "ReconcileFn",
    "ReplayPolicy",
    "ResumeBlocked",
    "RetryPolicy",
    "RetryableToolError",
    "Rule",
    "RunConflict",
    "RunHandle",
    "RunResult",
    "RunlogError",
    "Runner",
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
