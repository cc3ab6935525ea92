"""Runlog: resumable long-running agent workflows.

``import runlog`` gives what an application author writes and calls: workflows, stages and rules
(``Workflow``, ``rule``), tools with replay and retry policies (``tool``, ``ReplayPolicy``,
``RetryPolicy``), the runners (``Runner``, ``AsyncRunner``), the resumer's application object
(``App``), settings and the errors an author catches: the public API of :mod:`runlog.producers` (the
agent-side SDK). With them, the fleet's client (``Client``, which submits runs to ``runlog worker``
processes, and its handles, ``SubmittedRun``). The list is pinned by ``tests/unit/test_public_api.py``.

The parts, each a package of its own:

* :mod:`runlog.schemas`: the contract (Avro schemas, the types they map to, the codec, topics, settings);
* :mod:`runlog.producers`: the agent-side SDK (workflows, tools, the run writer and its lease);
* :mod:`runlog.projections`: the Redis read models and the one fold that computes them;
* :mod:`runlog.processors`: the projector, the resumer, audits and the ``runlog`` command line;
* :mod:`runlog.testing`: in-memory parts and crash helpers to unit-test one's own workflows.
"""

import importlib
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as _version
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runlog.processors.fleet import Client, SubmittedRun
    from runlog.producers import (
        App,
        ArtifactError,
        ArtifactStore,
        AsyncChildRun,
        AsyncRunner,
        AsyncStageContext,
        Budget,
        CallInfo,
        CallPosition,
        ChildRun,
        Cron,
        DeliveryError,
        DeliveryFn,
        DictInputSource,
        Diverged,
        EffectInDoubt,
        InputNotFound,
        InputSource,
        JsonDirInputSource,
        LeaseLost,
        LocalArtifactStore,
        Price,
        PriceTable,
        Queue,
        RateLimit,
        RateLimited,
        ReconcileFn,
        ReplayPolicy,
        ResumeBlocked,
        RetryableToolError,
        RetryPolicy,
        Rule,
        RunCancelled,
        RunConflict,
        RunFailed,
        RunHandle,
        RunlogError,
        Runner,
        RunResult,
        Schedule,
        Settings,
        Stage,
        StageContext,
        StageFn,
        TerminalToolError,
        Tool,
        ToolError,
        ToolFn,
        Usage,
        VerificationFailed,
        WaitTimedOut,
        Workflow,
        WorkflowDefinitionError,
        WorkflowRegistry,
        load_args,
        rule,
        tool,
    )

try:
    __version__ = _version("runlog")
except PackageNotFoundError:  # a source tree that was never installed
    __version__ = "0+unknown"


def __getattr__(name: str) -> Any:
    """The SDK's names, imported on first use (PEP 562): ``import runlog.projections.fold`` alone loads
    no Kafka or Redis client, while ``runlog.Workflow`` and ``from runlog import Runner`` work as usual."""
    if name == "__version__" or name not in __all__:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    home = "runlog.processors.fleet" if name in _FLEET else "runlog.producers"
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


_FLEET = frozenset({"Client", "SubmittedRun"})
"""The names a fleet's clients use (:mod:`runlog.processors.fleet`); every other one is the SDK's."""

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
    "Client",
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
    "SubmittedRun",
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
    "__version__",
    "load_args",
    "rule",
    "tool",
]
