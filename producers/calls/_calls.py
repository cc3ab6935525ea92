"""What a tool call records and hands back: recorded calls, the recorded sources (``now``,
``random``, ``uuid``), the patch marker, the wait signal, stage outputs, and the error record of a
failure."""

from __future__ import annotations

import dataclasses
import json
import random as _random
import threading
import time
import uuid as _uuid
from collections.abc import Mapping
from typing import Any, TypeVar

from runlog.producers.base._trace import Span
from runlog.producers.calls._artifacts import ArtifactStore
from runlog.producers.define._tools import CallInfo, Tool
from runlog.schemas import ArtifactRef, ErrorInfo, ReplayPolicy
from runlog.schemas.errors import (
    TerminalToolError,
    WorkflowDefinitionError,
)

__all__ = [
    "INLINE_SLEEP_S",
    "JSON",
    "NOW",
    "PATCHED",
    "RANDOM",
    "SLEEP",
    "UUID",
    "WAIT",
    "RecordedCall",
    "RunWaits",
    "StageOutputs",
    "WaitTimedOut",
    "error_info",
    "require_mapping",
]

T = TypeVar("T")

JSON = "application/json"


def error_info(err: BaseException) -> ErrorInfo:
    """An exception as the ``ErrorInfo`` a ``FAILED`` event carries."""
    kind = getattr(err, "kind", None) or type(err).__name__
    retryable = bool(getattr(err, "retryable", False))
    return ErrorInfo(str(kind), str(err)[:2000] or type(err).__name__, retryable)


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedCall:
    """A call the log records for a stage being run again: what the guard compares a new call
    with, and its recorded result when there is one to reuse (None: called, no usable result)."""

    call_id: str
    tool: str | None
    request_hash: str | None
    result: ArtifactRef | None = None
    args: ArtifactRef | None = None
    """The recorded arguments (a sleep's hold its wake time, decided once)."""

    @property
    def index(self) -> int | None:
        tail = self.call_id.rsplit("/", 1)[-1]
        return int(tail) if tail.isdigit() else None

    @property
    def stage(self) -> str:
        return self.call_id.split("/", 1)[0]


def _recorded(call_id: str, v: RecordedCall | ArtifactRef) -> RecordedCall:
    return v if isinstance(v, RecordedCall) else RecordedCall(call_id, None, None, v)


def _sources_fn(kind: str) -> Any:
    def fn(call: CallInfo, **_: Any) -> Any:
        if kind == "now":
            return time.time()
        if kind == "random":
            return _random.random()
        return str(_uuid.uuid4())

    return fn


NOW = Tool("runlog.now", _sources_fn("now"), ReplayPolicy.SAFE)
"""The recorded clock: ``ctx.now()``."""
_WAIT_TOOL = Tool("runlog.wait", _sources_fn("never"), ReplayPolicy.SAFE)
"""A wait's position as the determinism guard sees it (its function is never called)."""
RANDOM = Tool("runlog.random", _sources_fn("random"), ReplayPolicy.SAFE)
"""The recorded random source: ``ctx.random()``."""
UUID = Tool("runlog.uuid", _sources_fn("uuid"), ReplayPolicy.SAFE)
"""The recorded id source: ``ctx.uuid()``."""
PATCHED = Tool("runlog.patched", lambda call, **_: True, ReplayPolicy.SAFE)
"""The marker of a patch a stage took (``ctx.patched(patch_id)`` returned True): its request is
``{"patch": patch_id}``, its recorded result ``true``."""


WAIT = "runlog.wait"
"""The tool name of a wait's position (``ctx.wait_for``); its recorded result is the signal's data."""

SLEEP = "runlog.sleep"
"""The tool name of a durable timer's position (``ctx.sleep`` / ``ctx.sleep_until``): its recorded
arguments hold the wake time (``wake_at_ms``), its recorded result marks the sleep as over. While the
run sleeps it is ``WAITING`` for the signal of this name, with the wake time as its deadline."""
_SLEEP_TOOL = Tool(SLEEP, _sources_fn("never"), ReplayPolicy.SAFE)
"""A sleep's position as the determinism guard sees it (its function is never called)."""

INLINE_SLEEP_S = 1.0
"""A sleep with at most this many seconds left is slept in the process, holding the lease (a
durable wait would cost more than it saves); a longer one lets go of the run until its wake time."""


class RunWaits(BaseException):  # control flow, not an error: stage code must not catch it
    """Raised by :meth:`StageContext.wait_for` after ``RUN_WAITING`` is appended: the runner lets go of
    the run (flush, lease released, no thread kept) until the signal arrives."""

    def __init__(self, run_id: str, call_id: str, signal: str, deadline_ms: int) -> None:
        self.run_id, self.call_id, self.signal, self.deadline_ms = run_id, call_id, signal, deadline_ms
        super().__init__(f"run {run_id} waits for signal {signal!r} ({call_id})")


class WaitTimedOut(TerminalToolError):
    """A wait's deadline passed without its signal and its policy is ``fail``."""


class StageOutputs:
    """Outputs of verified stages, given as dicts or artifact refs (loaded and verified lazily)."""

    def __init__(self, store: ArtifactStore, given: Mapping[str, Mapping[str, Any] | ArtifactRef]) -> None:
        self._store = store
        self._given = dict(given)
        self._loaded: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def __contains__(self, stage: object) -> bool:
        return stage in self._given or stage in self._loaded

    def __setitem__(self, stage: str, output: Mapping[str, Any]) -> None:
        with self._lock:
            self._loaded[stage] = dict(output)

    def get(self, stage: str) -> dict[str, Any]:
        with self._lock:
            if stage in self._loaded:
                return self._loaded[stage]
            if stage not in self._given:
                raise KeyError(stage)
            v = self._given[stage]
            out = json.loads(self._store.get(v)) if isinstance(v, ArtifactRef) else dict(v)
            self._loaded[stage] = out
            return out

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {s: self.get(s) for s in [*self._given, *self._loaded]}


def _reused(span: Span, source: str) -> None:
    span.set("reused", True)
    span.set("source", source)


def _external_id(record: Any) -> str | None:
    if isinstance(record, Mapping):
        v = record.get("external_id")
        if isinstance(v, str) and v:
            return v
    return None


def require_mapping(stage: str, out: Any) -> dict[str, Any]:
    if not isinstance(out, Mapping):
        raise WorkflowDefinitionError(f"stage {stage!r} must return a JSON object, got {type(out).__name__}")
    return dict(out)
