"""The run context a stage function receives: inputs, earlier outputs, and tool calls.

Each tool call is recorded as it happens (DESIGN.md, rule 3):
``TOOL_CALLED`` (args artifact, request hash, idempotency key for IDEMPOTENT
tools), for effect tools a *confirmed* ``EFFECT_INTENT`` before the tool
function is entered and ``EFFECT_RESULT`` (external id) after it, then
``TOOL_RESULT`` (result artifact). A call that fails for good appends
``FAILED`` (stage, tool, call_id, error) instead of ``TOOL_RESULT``; the stage has
then failed and the context refuses further calls. Before a tool is called the lease is
verified with a round trip to Redis, so a writer whose lease was taken (a takeover, an
operator's ``runlog cancel``) starts no further call: it raises ``LeaseLost``.

Call ids are ``f"{stage}/{tool}/{index}"``, ``index`` counting this stage's calls
in submission order, so re-running a stage reproduces them. Calls whose id is in
``recorded_calls`` are not made again: their recorded result is returned and
nothing is appended. Calls in ``reconciled`` are not made either: the external
record stands in for the result and one ``TOOL_RESULT`` with attribute
``source=reconciled`` is appended.

The determinism guard: a call made at the position (stage, index) of a recorded
call must be the recorded call, same tool and same request hash. Otherwise the
recorded result is never handed back: ``CALL_DIVERGED`` is appended (call id,
recorded and new tool and request hash) and :class:`~schemas.errors.Diverged` is
raised, which blocks the run. Stage code gets recorded sources for what would
diverge on a re-run: :meth:`StageContext.now`, :meth:`StageContext.random`,
:meth:`StageContext.uuid` are calls like any other, so a resume reads them back.

The effects ledger: before an effect tool executes, its delivery key is opened in
the ledger shared by all runs (:mod:`producers._ledger`). Done in another run: the
tool is not called, ``EFFECT_RECONCILED`` (attribute ``source=ledger``, ``from_run``)
records the existing external id. Open in another run: in doubt, the tool's
policy decides (``RECONCILE_FIRST`` asks, ``NEVER`` raises
:class:`~schemas.errors.EffectInDoubt`, ``IDEMPOTENT`` calls with the holder's
idempotency key, ``SAFE`` executes).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random as _random
import threading
import time
import uuid as _uuid
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from producers._artifacts import ArtifactStore
from producers._keys import canonical_json, delivery_key, idempotency_key, sha256_hex
from producers._ledger import EffectLedger, LedgerEntry
from producers._protocol import INLINE, IO, SYNC, Invoke, Mode, Steps, adrive, drive
from producers._session import AppendResult, RunSession
from producers._tools import CallInfo, Tool, retry_steps
from producers._trace import NO_TRACE, Span, Tracer
from schemas._types import ArtifactRef, EffectStatus, ErrorInfo, EventType, ReplayPolicy
from schemas.errors import (
    DeliveryError,
    Diverged,
    EffectInDoubt,
    LeaseLost,
    TerminalToolError,
    WorkflowDefinitionError,
)

__all__ = [
    "JSON",
    "AsyncStageContext",
    "RecordedCall",
    "StageContext",
    "StageOutputs",
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
_WAIT_TOOL = Tool("runlog.wait", _sources_fn("never"), ReplayPolicy.SAFE)
"""A wait's position as the determinism guard sees it (its function is never called)."""
"""The recorded clock: ``ctx.now()``."""
RANDOM = Tool("runlog.random", _sources_fn("random"), ReplayPolicy.SAFE)
"""The recorded random source: ``ctx.random()``."""
UUID = Tool("runlog.uuid", _sources_fn("uuid"), ReplayPolicy.SAFE)
"""The recorded id source: ``ctx.uuid()``."""


WAIT = "runlog.wait"
"""The tool name of a wait's position (``ctx.wait_for``); its recorded result is the signal's data."""


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


class _ContextCore:
    """State and protocol steps shared by :class:`StageContext` and :class:`AsyncStageContext`."""

    def __init__(self, session: RunSession, stage: str, store: ArtifactStore, outputs: StageOutputs, *,
                 recorded_calls: Mapping[str, RecordedCall | ArtifactRef],
                 reconciled: Mapping[str, Mapping[str, Any]], max_parallel: int = 8,
                 ledger: EffectLedger | None = None, deadlines: Mapping[str, int] | None = None,
                 mode: Mode | None = None, tracer: Tracer = NO_TRACE, span: Span | None = None) -> None:
        self.session = session
        self.stage = stage
        self.store = store
        self._outputs = outputs
        recorded = [_recorded(k, v) for k, v in recorded_calls.items()]
        self._recorded = {r.call_id: r for r in recorded}
        self._at_index = {r.index: r for r in recorded if r.stage == stage and r.index is not None}
        self._reconciled = reconciled
        self._ledger = ledger
        self._deadlines = deadlines or {}
        self._max_parallel = max_parallel
        self._mode = mode or self._default_mode()
        self._tracer = tracer
        self._span = span
        self._lock = threading.Lock()
        self._next_index = 0
        self._artifacts: dict[str, ArtifactRef] = {}
        self.failure: BaseException | None = None
        self._futures: list[Future[Any]] = []  # ctx.submit of a def stage (thread pool)
        self._pool: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[Any]] = []  # ctx.submit of an async def stage

    def _default_mode(self) -> Mode:
        return SYNC

    @property
    def run_id(self) -> str:
        return self.session.run_id

    @property
    def epoch(self) -> int:
        """The writer's lease epoch (the fencing token)."""
        return self.session.epoch

    @property
    def params(self) -> dict[str, Any]:
        return self.session.params

    def output_of(self, stage: str) -> dict[str, Any]:
        """The verified output of an earlier stage of this run."""
        return self._outputs.get(stage)

    def _put(self, data: bytes, media_type: str = JSON) -> Steps[ArtifactRef]:
        """Store bytes (a step: off the loop in the async form); listed in ``VERIFIED``'s artifacts."""
        ref: ArtifactRef = yield IO(self.store, "put", "aput", (data, media_type))
        self._add(ref)
        return ref

    @property
    def artifacts(self) -> tuple[ArtifactRef, ...]:
        with self._lock:
            return tuple(self._artifacts.values())

    def _add(self, ref: ArtifactRef) -> None:
        with self._lock:
            self._artifacts.setdefault(ref.sha256, ref)

    def _claim_index(self) -> int:
        with self._lock:
            if self.failure is not None:
                raise self.failure
            i = self._next_index
            self._next_index += 1
            return i

    def _fail(self, err: BaseException) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = err

    def _verify(self) -> IO:
        return IO(self.session.lease, "verify", "averify")

    # -- a tool call --------------------------------------------------------------------------

    def _call_steps(self, tool: Tool, index: int, args: Mapping[str, Any]) -> Steps[Any]:
        s = self.session
        span = self._tracer.start("call", tool.name, self._span, {
            "run_id": s.run_id, "stage": self.stage, "call_id": f"{self.stage}/{tool.name}/{index}",
            "tool": tool.name, "epoch": s.epoch, "replay_policy": tool.policy.value})
        try:
            result = yield from self._invoke(tool, index, args, span)
        except BaseException as err:
            span.end(err)
            raise
        span.end()
        return result

    def _invoke(self, tool: Tool, index: int, args: Mapping[str, Any], span: Span) -> Steps[Any]:
        s, stage = self.session, self.stage
        call_id = f"{stage}/{tool.name}/{index}"
        common: dict[str, Any] = {"stage": stage, "tool": tool.name, "call_id": call_id,
                                  "replay_policy": tool.policy}
        args_bytes = canonical_json(dict(args))
        request_hash = sha256_hex(args_bytes)
        rec = self._at_index.get(index)
        if rec is not None:
            yield from self._guard(rec, call_id, tool, request_hash, common)
            if rec.result is not None:
                result = json.loads((yield IO(self.store, "get", "aget", (rec.result,))))
                self._add(rec.result)
                _reused(span, "recorded")
                return result
        if call_id in self._reconciled:
            record = dict(self._reconciled[call_id])
            ref = yield from self._put(canonical_json(record))
            yield s.appending(EventType.TOOL_RESULT, payload_ref=ref, external_id=_external_id(record),
                              attributes={"source": "reconciled"}, **common)
            _reused(span, "reconciled")
            return record
        idem = (idempotency_key(s.run_id, stage, tool.name, index, request_hash)
                if tool.policy is ReplayPolicy.IDEMPOTENT else None)
        info = CallInfo(s.run_id, stage, tool.name, call_id, index, s.epoch, request_hash, idem)
        args_ref = yield from self._put(args_bytes)
        # A round trip before every call: a writer whose lease was taken (a takeover, `runlog cancel`)
        # starts no further tool call, even before its heartbeat notices (LeaseLost).
        yield self._verify()
        called: AppendResult = yield s.appending(EventType.TOOL_CALLED, idempotency_key=idem,
                                                 payload_ref=args_ref, request_hash=request_hash, **common)
        span.set("seq", called.event.seq)
        if tool.effect:
            assert tool.delivery is not None  # checked at definition time
            info = dataclasses.replace(info, delivery_key=delivery_key(*tool.delivery(args, info)))
            assert info.delivery_key is not None
            span.set("delivery_key", info.delivery_key)
            elsewhere = yield from self._open_effect(tool, info)
            own = elsewhere is not None and (elsewhere.run_id, elsewhere.call_id) == (s.run_id, call_id)
            if own and tool.policy is ReplayPolicy.IDEMPOTENT:
                elsewhere = None  # this very call, done before a crash: call again with its key (full record)
            if elsewhere is not None:
                if elsewhere.done:
                    _reused(span, "ledger")
                    return (yield from self._reuse_effect(tool, info, args, elsewhere, common))
                settled = yield from self._in_doubt(tool, info, args, elsewhere, common)
                if settled is not None:
                    _reused(span, "ledger")
                    return settled
                if tool.policy is ReplayPolicy.IDEMPOTENT and elsewhere.idempotency_key:
                    info = dataclasses.replace(info, idempotency_key=elsewhere.idempotency_key)
            yield self._verify()  # a round trip: refuse to start an effect without the lease
            yield s.appending(EventType.EFFECT_INTENT, confirm=True, delivery_key=info.delivery_key,
                              target=tool.target, request_hash=request_hash,
                              idempotency_key=info.idempotency_key, **common)
        yield s.crashing(f"inside:TOOL:{call_id}")
        span.set("reused", False)
        span.set("source", "executed")

        def attempt(n: int) -> Steps[Any]:
            s.check()
            return (yield Invoke(tool.fn, (dataclasses.replace(info, attempt=n),), dict(args)))

        def before_retry(n: int) -> Steps[None]:
            if tool.effect:
                yield self._verify()
            else:
                s.check()

        try:
            result, attempts = yield from retry_steps(attempt, tool.retry, before_retry)
            result_bytes = canonical_json(result)
            if tool.effect and _external_id(result) is None:
                raise TerminalToolError(f"effect tool {tool.name!r} must return a JSON object with a "
                                        f"string 'external_id', got {type(result).__name__}",
                                        kind="InvalidEffectResult")
        except (LeaseLost, DeliveryError):
            raise
        except Exception as err:  # any tool failure is recorded, then re-raised
            if tool.effect and self._ledger is not None and info.delivery_key is not None:
                yield IO(self._ledger, "close", "aclose_effect",
                         (info.delivery_key, s.run_id, call_id, EffectStatus.FAILED))
            self._fail(err)
            yield s.appending(EventType.FAILED, error=error_info(err), delivery_key=info.delivery_key,
                              **common)
            raise
        if tool.effect:
            assert info.delivery_key is not None
            if self._ledger is not None:
                yield IO(self._ledger, "close", "aclose_effect",
                         (info.delivery_key, s.run_id, call_id, EffectStatus.DONE, _external_id(result)))
            yield s.appending(EventType.EFFECT_RESULT, delivery_key=info.delivery_key, target=tool.target,
                              external_id=_external_id(result), **common)
        ref = yield from self._put(result_bytes)
        yield s.appending(EventType.TOOL_RESULT, payload_ref=ref, attributes={"attempts": str(attempts)},
                          **common)
        return result

    # -- a durable wait -------------------------------------------------------------------------

    def _wait_steps(self, signal: str, timeout: float | None, on_timeout: str, default: Any) -> Steps[Any]:
        if on_timeout not in ("fail", "default"):
            raise WorkflowDefinitionError(f"wait_for({signal!r}): on_timeout must be 'fail' or 'default'")
        if not signal:
            raise WorkflowDefinitionError("wait_for needs a signal name")
        index = self._claim_index()
        s = self.session
        call_id = f"{self.stage}/{WAIT}/{index}"
        args = {"signal": signal, "timeout": timeout, "on_timeout": on_timeout, "default": default}
        common: dict[str, Any] = {"stage": self.stage, "tool": WAIT, "call_id": call_id,
                                  "replay_policy": ReplayPolicy.SAFE}
        args_bytes = canonical_json(args)
        request_hash = sha256_hex(args_bytes)
        rec = self._at_index.get(index)
        if rec is not None:
            yield from self._guard(rec, call_id, _WAIT_TOOL, request_hash, common)
            if rec.result is not None:
                self._add(rec.result)
                return json.loads((yield IO(self.store, "get", "aget", (rec.result,))))
        deadline = self._deadlines.get(call_id, 0)
        if deadline and time.time() * 1000 >= deadline:
            if on_timeout == "fail":
                err = WaitTimedOut(f"waiting for signal {signal!r} timed out ({call_id})",
                                   kind="WaitTimedOut")
                self._fail(err)
                yield s.appending(EventType.FAILED, error=error_info(err), **common)
                raise err
            ref = yield from self._put(canonical_json(default))
            yield s.appending(EventType.SIGNAL_RECEIVED, payload_ref=ref,
                              attributes={"signal": signal, "timed_out": "true"}, **common)
            return default
        if rec is None:
            yield s.appending(EventType.TOOL_CALLED, payload_ref=(yield from self._put(args_bytes)),
                              request_hash=request_hash, **common)
        if not deadline and timeout is not None:
            deadline = int(time.time() * 1000 + timeout * 1000)
        attrs = {"signal": signal, "deadline_ms": str(deadline), "on_timeout": on_timeout}
        yield s.appending(EventType.RUN_WAITING, confirm=True, attributes=attrs, **common)
        raise RunWaits(s.run_id, call_id, signal, deadline)

    # -- the determinism guard ----------------------------------------------------------------

    def _guard(self, rec: RecordedCall, call_id: str, tool: Tool, request_hash: str,
               common: dict[str, Any]) -> Steps[None]:
        """Refuse a call that is not the one recorded at its position (see the module docstring)."""
        same_tool = rec.call_id == call_id
        same_args = rec.request_hash is None or rec.request_hash == request_hash
        if same_tool and same_args:
            return
        recorded = f"{rec.tool or rec.call_id.split('/')[1]} with request {(rec.request_hash or '?')[:16]}"
        new = f"{tool.name} with request {request_hash[:16]}"
        err = Diverged(self.session.run_id, rec.call_id, recorded, new)
        self._fail(err)
        yield self.session.appending(
            EventType.CALL_DIVERGED, request_hash=request_hash, error=ErrorInfo("Diverged", str(err), False),
            attributes={"recorded_call_id": rec.call_id, "recorded_tool": rec.tool or "",
                        "recorded_request_hash": rec.request_hash or ""}, **common)
        raise err

    # -- the effects ledger ---------------------------------------------------------------------

    def _open_effect(self, tool: Tool, info: CallInfo) -> Steps[LedgerEntry | None]:
        if self._ledger is None or info.delivery_key is None:
            return None
        entry = LedgerEntry(info.delivery_key, info.run_id, info.call_id, EffectStatus.INTENT, None,
                            info.idempotency_key, tool.name)
        found: LedgerEntry | None = yield IO(self._ledger, "open", "aopen", (entry,))
        return found

    def _settle(self, tool: Tool, info: CallInfo, record: Mapping[str, Any], common: dict[str, Any],
                attrs: dict[str, str]) -> Steps[dict[str, Any]]:
        """Record an effect found done in the world: ``EFFECT_RECONCILED`` then ``TOOL_RESULT``."""
        s = self.session
        assert info.delivery_key is not None
        out = dict(record)
        ref = yield from self._put(canonical_json(out))
        yield s.appending(EventType.EFFECT_RECONCILED, confirm=True, delivery_key=info.delivery_key,
                          target=tool.target, external_id=_external_id(out), payload_ref=ref,
                          attributes=attrs, **common)
        yield s.appending(EventType.TOOL_RESULT, payload_ref=ref, external_id=_external_id(out),
                          attributes={"source": attrs.get("source", "reconciled")}, **common)
        return out

    def _reuse_effect(self, tool: Tool, info: CallInfo, args: Mapping[str, Any], other: LedgerEntry,
                      common: dict[str, Any]) -> Steps[dict[str, Any]]:
        """Done in another run: no call; that run's external id is this call's result."""
        record: Mapping[str, Any] | None = None
        if tool.reconcile is not None and info.delivery_key is not None:
            record = yield Invoke(tool.reconcile, (info.delivery_key, args))
        if record is None or _external_id(record) != other.external_id:
            record = {"external_id": other.external_id}
        attrs = {"source": "ledger", "from_run": other.run_id, "from_call": other.call_id or "",
                 "ledger": other.source}
        return (yield from self._settle(tool, info, record, common, attrs))

    def _in_doubt(self, tool: Tool, info: CallInfo, args: Mapping[str, Any], other: LedgerEntry,
                  common: dict[str, Any]) -> Steps[dict[str, Any] | None]:
        """Open in another run. Returns the record when reconcile found the effect done; None to
        execute; raises EffectInDoubt when the policy leaves it to a person."""
        dk = info.delivery_key
        assert dk is not None
        if tool.policy is ReplayPolicy.RECONCILE_FIRST and tool.reconcile is not None:
            record = yield Invoke(tool.reconcile, (dk, args))
            if record is not None and _external_id(record) is not None:
                if self._ledger is not None:
                    yield IO(self._ledger, "close", "aclose_effect",
                             (dk, info.run_id, info.call_id, EffectStatus.RECONCILED, _external_id(record)))
                attrs = {"source": "ledger", "from_run": other.run_id, "from_call": other.call_id or "",
                         "ledger": other.source, "reconciled": "true"}
                return (yield from self._settle(tool, info, record, common, attrs))
            return None
        if tool.policy is ReplayPolicy.NEVER:
            err = EffectInDoubt(
                info.run_id, dk, other.run_id,
                f"{tool.name} (NEVER) for {tool.target}: delivery key {dk} is in doubt in run "
                f"{other.run_id} (call {other.call_id}, {other.status.value}); a person must check "
                "whether it happened before this run may go on")
            self._fail(err)
            raise err
        return None


_WAIT_DOC = """Wait for a person or another system: returns the data of the signal named ``signal``.

        The first time, ``RUN_WAITING`` (signal, deadline) is appended and the run is let go: the
        runner flushes, releases the lease and returns; no thread, lease or worker is held while
        it waits. ``runlog signal RUN NAME --data JSON`` (or ``approve`` / ``reject``) appends
        ``SIGNAL_RECEIVED`` and asks for a resume; the resumed stage runs again from its start and
        this call returns the signal's data, a recorded result (reused on any later resume).

        Args:
            timeout: seconds until the wait times out (None: never). The resumers' sweep resumes
                the run at the deadline.
            on_timeout: ``"fail"`` (the stage fails with :class:`WaitTimedOut`, a terminal error)
                or ``"default"`` (``default`` is recorded as the signal's data and returned).
        """


class StageContext(_ContextCore):
    """What a ``def`` stage function gets as ``ctx``; safe to use from several threads."""

    def _run(self, steps: Steps[T]) -> T:
        return drive(steps, self._mode)

    def put_artifact(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        """Store bytes; the ref is listed in this stage's ``VERIFIED`` artifacts."""
        return self._run(self._put(data, media_type))

    def call(self, tool: Tool, /, **args: Any) -> Any:
        """Call a tool now and return its result (recorded on the log)."""
        return self._run(self._call_steps(tool, self._claim_index(), args))

    # -- recorded sources: what stage code reads instead of the clock, random and uuid --------

    def now(self) -> float:
        """Seconds since the epoch, recorded: a resume of this stage reads the same value back."""
        return float(self.call(NOW))

    def random(self) -> float:
        """A float in [0, 1), recorded: a resume of this stage reads the same value back."""
        return float(self.call(RANDOM))

    def uuid(self) -> str:
        """A random UUID (text), recorded: a resume of this stage reads the same value back."""
        return str(self.call(UUID))

    def wait_for(self, signal: str, *, timeout: float | None = None, on_timeout: str = "fail",
                 default: Any = None) -> Any:
        return self._run(self._wait_steps(signal, timeout, on_timeout, default))

    wait_for.__doc__ = _WAIT_DOC

    def submit(self, tool: Tool, /, **args: Any) -> Future[Any]:
        """Start a tool call in the background; its call index is taken now (submission order)."""
        index = self._claim_index()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_parallel, thread_name_prefix=f"runlog-{self.stage}")
            fut = self._pool.submit(self._run, self._call_steps(tool, index, args))
            self._futures.append(fut)
        return fut

    def parallel(self, *calls: tuple[Tool, Mapping[str, Any]]) -> list[Any]:
        """Run ``(tool, args)`` calls concurrently; results in order. The first failure is raised
        after all calls have finished."""
        futures = [self.submit(t, **a) for t, a in calls]
        wait(futures)
        return [f.result() for f in futures]

    def finish(self) -> None:
        """Wait for every submitted call (so nothing is appended after the stage ends)."""
        with self._lock:
            futures, pool = list(self._futures), self._pool
        wait(futures)
        if pool is not None:
            pool.shutdown(wait=True)


class AsyncStageContext(_ContextCore):
    """What an ``async def`` stage function gets as ``ctx``: the same calls, awaited.

    ``await ctx.call(tool, **args)``; concurrent calls with :meth:`submit` (an asyncio task,
    its call index taken at submission) or ``await ctx.parallel((tool, args), ...)``; a ``def``
    tool runs on an executor, an ``async def`` tool on the loop.
    """

    def _default_mode(self) -> Mode:
        return INLINE

    async def _run(self, steps: Steps[T]) -> T:
        return await adrive(steps, self._mode)

    async def put_artifact(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        """Store bytes (off the loop); the ref is listed in this stage's ``VERIFIED`` artifacts."""
        return await self._run(self._put(data, media_type))

    async def call(self, tool: Tool, /, **args: Any) -> Any:
        """Call a tool now and return its result (recorded on the log)."""
        return await self._run(self._call_steps(tool, self._claim_index(), args))

    async def now(self) -> float:
        """Seconds since the epoch, recorded: a resume of this stage reads the same value back."""
        return float(await self.call(NOW))

    async def random(self) -> float:
        """A float in [0, 1), recorded: a resume of this stage reads the same value back."""
        return float(await self.call(RANDOM))

    async def uuid(self) -> str:
        """A random UUID (text), recorded: a resume of this stage reads the same value back."""
        return str(await self.call(UUID))

    async def wait_for(self, signal: str, *, timeout: float | None = None, on_timeout: str = "fail",
                       default: Any = None) -> Any:
        return await self._run(self._wait_steps(signal, timeout, on_timeout, default))

    wait_for.__doc__ = _WAIT_DOC

    def submit(self, tool: Tool, /, **args: Any) -> asyncio.Task[Any]:
        """Start a tool call as a task on the running loop; its call index is taken now."""
        index = self._claim_index()
        task = asyncio.ensure_future(self._run(self._call_steps(tool, index, args)))
        self._tasks.append(task)
        return task

    async def parallel(self, *calls: tuple[Tool, Mapping[str, Any]]) -> list[Any]:
        """Run ``(tool, args)`` calls concurrently; results in order. The first failure is raised
        after all calls have finished."""
        tasks = [self.submit(t, **a) for t, a in calls]
        if tasks:
            await asyncio.wait(tasks)
        return [t.result() for t in tasks]

    async def finish(self) -> None:
        """Wait for every submitted call (so nothing is appended after the stage ends)."""
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            await asyncio.wait(tasks)
        for t in self._tasks:  # retrieved: a failure already recorded is not "never retrieved"
            if not t.cancelled():
                t.exception()


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
