"""A tool call as protocol steps (the context's core, both faces share it): recording, the
determinism guard, the effects ledger, retries and waits.

Each tool call is recorded as it happens, before its result is used:
``TOOL_CALLED`` (args artifact, request hash, idempotency key for IDEMPOTENT
tools), for effect tools a *confirmed* ``EFFECT_INTENT`` before the tool
function is entered and ``EFFECT_RESULT`` (external id) after it, then
``TOOL_RESULT`` (result artifact). A call that fails for good appends
``FAILED`` (stage, tool, call_id, error) instead of ``TOOL_RESULT``; the stage has
then failed and the context refuses further calls. Before a tool is called the lease is
verified with a round trip to Redis, so a writer whose lease was taken (a takeover, an
operator's ``runlog cancel``) starts no further call: it raises ``LeaseLost``.

Call ids are ``f"{stage}/{tool}/{index}"``, ``index`` counting this stage's calls
in the order they are made (``ctx.call`` invoked, ``ctx.submit``, or positions reserved for a
parallel group), never the order they finish, so re-running a stage reproduces them however its
concurrent calls' timing differs. Calls whose id is in
``recorded_calls`` are not made again: their recorded result is returned and
nothing is appended. Calls in ``reconciled`` are not made either: the external
record stands in for the result and one ``TOOL_RESULT`` with attribute
``source=reconciled`` is appended.

The determinism guard: a call made at the position (stage, index) of a recorded
call must be the recorded call, same tool and same request hash. Otherwise the
recorded result is never handed back: ``CALL_DIVERGED`` is appended (call id,
recorded and new tool and request hash) and :class:`~runlog.schemas.errors.Diverged` is
raised, which blocks the run. Stage code gets recorded sources for what would
diverge on a re-run: :meth:`StageContext.now`, :meth:`StageContext.random`,
:meth:`StageContext.uuid` are calls like any other, so a resume reads them back.

Patches: ``ctx.patched(patch_id)`` lets a stage change its calls for new runs while runs recorded
before the change replay as they were. At the stage's next call position it is True, and a marker
call (tool ``runlog.patched``, request ``{"patch": patch_id}``, result ``true``) is recorded there,
when that position holds the same patch's marker (a replay of a run that took the patch) or lies
past every call recorded for the stage (a run reaching it on new code). It is False, recording
nothing and taking no position, when the stage's recorded calls go on at or past that position
without the marker (a run recorded before the patch existed): the calls after it keep their
recorded positions. A patch id is decided once per stage execution: asked again, it answers the same.

The effects ledger: before an effect tool executes, its delivery key is opened in
the ledger shared by all runs (:mod:`runlog.producers.calls._ledger`). Done in another run: the
tool is not called, ``EFFECT_RECONCILED`` (attribute ``source=ledger``, ``from_run``)
records the existing external id. Open in another run: in doubt, the tool's
policy decides (``RECONCILE_FIRST`` asks, ``NEVER`` raises
:class:`~runlog.schemas.errors.EffectInDoubt`, ``IDEMPOTENT`` calls with the holder's
idempotency key, ``SAFE`` executes).
"""


from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from runlog.producers.base._protocol import IO, SYNC, Invoke, Mode, Sleep, Steps, io
from runlog.producers.base._trace import NO_TRACE, Span, Tracer
from runlog.producers.calls._artifacts import ArtifactStore
from runlog.producers.calls._call_budget import CallBudget
from runlog.producers.calls._call_ledger import EffectClaims
from runlog.producers.calls._call_patch import PatchTable
from runlog.producers.calls._call_positions import CallPositions
from runlog.producers.calls._calls import (
    _SLEEP_TOOL,
    _WAIT_TOOL,
    INLINE_SLEEP_S,
    PATCHED,
    SLEEP,
    WAIT,
    RecordedCall,
    RunWaits,
    StageOutputs,
    WaitTimedOut,
    _external_id,
    _recorded,
    _reused,
    error_info,
)
from runlog.producers.calls._keys import canonical_json, delivery_key, idempotency_key
from runlog.producers.calls._ledger import EffectLedger
from runlog.producers.calls._limiter import Limiter
from runlog.producers.calls._replay_hook import tool_function
from runlog.producers.calls._stage_artifacts import StageArtifacts
from runlog.producers.calls._stored_args import ArgsWriter
from runlog.producers.calls._throttle import LIMIT, LIMIT_SINCE, Metered, Park, limit_since_key, metered
from runlog.producers.define._prices import PriceTable, usage_of
from runlog.producers.define._tools import CallInfo, Tool, retry_steps
from runlog.producers.log._session import AppendResult, RunSession
from runlog.schemas import ArtifactRef, EffectStatus, ErrorInfo, EventType, ReplayPolicy
from runlog.schemas.errors import (
    DeliveryError,
    Diverged,
    LeaseLost,
    RateLimited,
    TerminalToolError,
    WorkflowDefinitionError,
)

__all__: list[str] = []


class _Counter:
    """A count shared by a stage's call threads."""

    def __init__(self) -> None:
        self.value = 0
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.value += n


class _ContextCore:
    """State and protocol steps shared by :class:`StageContext` and :class:`AsyncStageContext`.

    Its parts: the stage's call :attr:`positions` (and its failure), the :attr:`stored` artifacts,
    the :attr:`args` writer, the :attr:`effects` claims in the ledger, the :attr:`budget` and the
    :attr:`patches` table."""

    def __init__(self, session: RunSession, stage: str, store: ArtifactStore, outputs: StageOutputs, *,
                 recorded_calls: Mapping[str, RecordedCall | ArtifactRef],
                 reconciled: Mapping[str, Mapping[str, Any]], max_parallel: int = 8,
                 ledger: EffectLedger | None = None, deadlines: Mapping[str, int] | None = None,
                 mode: Mode | None = None, tracer: Tracer = NO_TRACE, span: Span | None = None,
                 prices: PriceTable | None = None, limiter: Limiter | None = None) -> None:
        self.session = session
        self.stage = stage
        self.store = store
        self._outputs = outputs
        recorded = [_recorded(k, v) for k, v in recorded_calls.items()]
        self._recorded = {r.call_id: r for r in recorded}
        self._at_index = {r.index: r for r in recorded if r.stage == stage and r.index is not None}
        # one past the last position the log records for this stage (a call, a reconciled one, a wait)
        known = [*recorded, *(RecordedCall(k, None, None) for k in (*reconciled, *(deadlines or {})))]
        recorded_end = 1 + max((r.index for r in known if r.stage == stage and r.index is not None),
                               default=-1)
        self._reconciled = reconciled
        self._deadlines = deadlines or {}
        self._max_parallel = max_parallel
        self._mode = mode or self._default_mode()
        self._tracer = tracer
        self._prices = prices if prices is not None else PriceTable()  # prices what calls report spent
        self._limiter = limiter  # counts the calls of tools with a rate limit (None: not counted)
        self._span = span
        self.positions = CallPositions()
        self.stored = StageArtifacts(store)
        self.args = ArgsWriter(self.stored)
        self.effects = EffectClaims(session, ledger, self.stored, self.positions.fail)
        self.budget = CallBudget(session, self.positions.fail)
        self.patches = PatchTable(stage, self.positions, self._at_index, recorded_end, store.digest)
        self._lock = threading.Lock()  # the thread pool of ctx.submit
        self._futures: list[Future[Any]] = []  # ctx.submit of a def stage (thread pool)
        self._pool: ThreadPoolExecutor | None = None
        self._tasks: list[asyncio.Task[Any]] = []  # ctx.submit of an async def stage
        self._in_flight = _Counter()  # calls under way (a durable limit wait only for a lone one)

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

    @property
    def failure(self) -> BaseException | None:
        """The error that failed the stage (a tool call's, a divergence), or None."""
        return self.positions.failure

    def output_of(self, stage: str) -> dict[str, Any]:
        """The verified output of an earlier stage of this run."""
        return self._outputs.get(stage)

    @property
    def artifacts(self) -> tuple[ArtifactRef, ...]:
        return self.stored.refs

    def _verify(self) -> IO[None]:
        return io(self.session.lease.verify, self.session.lease.averify)

    def _patched_steps(self, patch_id: str) -> Steps[bool]:
        """Whether this execution of the stage takes patch ``patch_id`` (see the module docstring): a
        taken patch's marker is recorded as a call at the position the patch table claimed."""
        taken, index = self.patches.decide(patch_id)
        if index is not None:
            yield from self._call_steps(PATCHED, index, PatchTable.marker_args(patch_id))
        return taken

    # -- a tool call --------------------------------------------------------------------------

    def _call_steps(self, tool: Tool, index: int, args: Mapping[str, Any]) -> Steps[Any]:
        s = self.session
        span = self._tracer.start("call", tool.name, self._span, {
            "run_id": s.run_id, "stage": self.stage, "call_id": f"{self.stage}/{tool.name}/{index}",
            "tool": tool.name, "epoch": s.epoch, "replay_policy": tool.policy.value})
        self._in_flight.add(1)
        try:
            result = yield from self._invoke(tool, index, args, span)
        except BaseException as err:
            span.end(err)
            raise
        finally:
            self._in_flight.add(-1)
        span.end()
        return result

    def _invoke(self, tool: Tool, index: int, args: Mapping[str, Any], span: Span) -> Steps[Any]:
        s, stage = self.session, self.stage
        call_id = f"{stage}/{tool.name}/{index}"
        common: dict[str, Any] = {"stage": stage, "tool": tool.name, "call_id": call_id,
                                  "replay_policy": tool.policy}
        args_bytes = canonical_json(dict(args))
        request_hash = self.store.digest(args_bytes)
        rec = self._at_index.get(index)
        if rec is not None:
            yield from self._guard(rec, call_id, tool, request_hash, common)
            if rec.result is not None:
                result = json.loads((yield from io(self.store.get, self.store.aget, rec.result)))
                self.stored.add(rec.result)
                _reused(span, "recorded")
                return result
        if call_id in self._reconciled:
            record = dict(self._reconciled[call_id])
            ref = yield from self.stored.put(canonical_json(record))
            yield from s.appending(EventType.TOOL_RESULT, payload_ref=ref, external_id=_external_id(record),
                                   attributes={"source": "reconciled"}, **common)
            _reused(span, "reconciled")
            return record
        yield from self.budget.check(tool, call_id, common)  # a model call: not past a hard cap
        idem = (idempotency_key(s.run_id, stage, tool.name, index, request_hash)
                if tool.policy is ReplayPolicy.IDEMPOTENT else None)
        info = CallInfo(s.run_id, stage, tool.name, call_id, index, s.epoch, request_hash, idem)
        args_ref = yield from self.args.put(tool, args, args_bytes)  # by reference as the tool declares
        meter = metered(self._limiter, tool, args, s.check)
        if meter is not None:
            since = self._deadlines.get(limit_since_key(call_id), 0)  # it waited durably before
            if since:  # for its reservation: what it reserved is its take
                meter.waited_s = max(0.0, time.time() - since / 1000)
            elif not tool.effect:  # the first attempt's take, before anything of the call is on the log
                yield from meter.take(self._parking(call_id, meter, common))
            # an effect tool takes in its attempts, in its thread: a durable wait would leave its
            # claim in the ledger (and its intent) open for the resume to find in doubt
        # a round trip before every call: a writer whose lease was taken starts no further call (LeaseLost)
        yield from self._verify()
        called: AppendResult = yield from s.appending(EventType.TOOL_CALLED, idempotency_key=idem,
                                                      payload_ref=args_ref, request_hash=request_hash,
                                                      **common)
        span.set("seq", called.event.seq)
        if tool.effect:
            assert tool.delivery is not None  # checked at definition time
            info = dataclasses.replace(info, delivery_key=delivery_key(*tool.delivery(args, info)))
            assert info.delivery_key is not None
            span.set("delivery_key", info.delivery_key)
            elsewhere = yield from self.effects.open(tool, info)
            own = elsewhere is not None and (elsewhere.run_id, elsewhere.call_id) == (s.run_id, call_id)
            if own and tool.policy is ReplayPolicy.IDEMPOTENT:
                elsewhere = None  # this very call, done before a crash: call again with its key (full record)
            if elsewhere is not None:
                if elsewhere.done:
                    _reused(span, "ledger")
                    return (yield from self.effects.reuse(tool, info, args, elsewhere, common))
                settled = yield from self.effects.in_doubt(tool, info, args, elsewhere, common)
                if settled is not None:
                    _reused(span, "ledger")
                    return settled
                if tool.policy is ReplayPolicy.IDEMPOTENT and elsewhere.idempotency_key:
                    info = dataclasses.replace(info, idempotency_key=elsewhere.idempotency_key)
            yield from self._verify()  # a round trip: refuse to start an effect without the lease
            yield from s.appending(EventType.EFFECT_INTENT, confirm=True, delivery_key=info.delivery_key,
                                   target=tool.target, request_hash=request_hash,
                                   idempotency_key=info.idempotency_key, **common)
        yield from s.crashing(f"inside:TOOL:{call_id}")
        span.set("reused", False)
        span.set("source", "executed")

        def attempt(n: int) -> Steps[Any]:
            s.check()
            if meter is not None and (n > 1 or tool.effect):  # a retry (after a 429, say) takes again
                yield from meter.take(None if tool.effect else self._parking(call_id, meter, common))
            call = dataclasses.replace(info, attempt=n)
            try:
                return (yield from Invoke(tool_function(tool, s.run_id), (call,), dict(args)))
            except RateLimited as err:
                if meter is not None:
                    yield from meter.refused(err)
                raise

        def before_retry(n: int) -> Steps[None]:
            if tool.effect:
                yield from self._verify()
            else:
                s.check()

        try:
            result, attempts = yield from retry_steps(attempt, tool.retry, before_retry)
            result_bytes = canonical_json(result)
            spent = usage_of(tool.usage, result, self._prices, f"tool {tool.name!r}")
            if tool.effect and _external_id(result) is None:
                raise TerminalToolError(f"effect tool {tool.name!r} must return a JSON object with a "
                                        f"string 'external_id', got {type(result).__name__}",
                                        kind="InvalidEffectResult")
        except (LeaseLost, DeliveryError):
            raise
        except Exception as err:  # any tool failure is recorded, then re-raised
            if tool.effect:
                yield from self.effects.close(info, EffectStatus.FAILED)
            self.positions.fail(err)
            yield from s.appending(EventType.FAILED, error=error_info(err), delivery_key=info.delivery_key,
                                   **common)
            raise
        if tool.effect:
            assert info.delivery_key is not None
            yield from self.effects.close(info, EffectStatus.DONE, _external_id(result))
            yield from s.appending(EventType.EFFECT_RESULT, delivery_key=info.delivery_key,
                                   target=tool.target, external_id=_external_id(result), **common)
        limited: dict[str, str] = {}
        if meter is not None:
            yield from meter.settle(spent)
            limited = meter.attributes()
        ref = yield from self.stored.put(result_bytes)
        yield from s.appending(EventType.TOOL_RESULT, payload_ref=ref, usage=spent, **common,
                               attributes={"attempts": str(attempts), **self.budget.spent(spent), **limited})
        return result

    # -- a durable wait for a rate limit -------------------------------------------------------

    def _parking(self, call_id: str, meter: Metered, common: dict[str, Any]) -> Park | None:
        """How the call waits durably for its limit, or None when it must wait in its thread: another
        call of this stage is in flight beside it (letting go of the run would strand it)."""
        if self._in_flight.value > 1:
            return None
        s = self.session

        def park(wait_s: float) -> Steps[None]:
            now = int(time.time() * 1000)
            wake = now + max(1, math.ceil(wait_s * 1000))
            since = now - round(meter.waited_s * 1000)
            attrs = {"signal": LIMIT, "deadline_ms": str(wake), "on_timeout": "default",
                     "limit": meter.limit.key, LIMIT_SINCE: str(since)}
            yield from s.appending(EventType.RUN_WAITING, confirm=True, attributes=attrs, **common)
            raise RunWaits(s.run_id, call_id, LIMIT, wake)

        return park

    # -- a durable wait -------------------------------------------------------------------------

    def _wait_steps(self, signal: str, timeout: float | None, on_timeout: str, default: Any) -> Steps[Any]:
        if on_timeout not in ("fail", "default"):
            raise WorkflowDefinitionError(f"wait_for({signal!r}): on_timeout must be 'fail' or 'default'")
        if not signal:
            raise WorkflowDefinitionError("wait_for needs a signal name")
        index = self.positions.claim()
        s = self.session
        call_id = f"{self.stage}/{WAIT}/{index}"
        args = {"signal": signal, "timeout": timeout, "on_timeout": on_timeout, "default": default}
        common: dict[str, Any] = {"stage": self.stage, "tool": WAIT, "call_id": call_id,
                                  "replay_policy": ReplayPolicy.SAFE}
        args_bytes = canonical_json(args)
        request_hash = self.store.digest(args_bytes)
        rec = self._at_index.get(index)
        if rec is not None:
            yield from self._guard(rec, call_id, _WAIT_TOOL, request_hash, common)
            if rec.result is not None:
                self.stored.add(rec.result)
                return json.loads((yield from io(self.store.get, self.store.aget, rec.result)))
        deadline = self._deadlines.get(call_id, 0)
        if deadline and time.time() * 1000 >= deadline:
            if on_timeout == "fail":
                err = WaitTimedOut(f"waiting for signal {signal!r} timed out ({call_id})",
                                   kind="WaitTimedOut")
                self.positions.fail(err)
                yield from s.appending(EventType.FAILED, error=error_info(err), **common)
                raise err
            ref = yield from self.stored.put(canonical_json(default))
            yield from s.appending(EventType.SIGNAL_RECEIVED, payload_ref=ref,
                                   attributes={"signal": signal, "timed_out": "true"}, **common)
            return default
        if rec is None:
            args_ref = yield from self.stored.put(args_bytes)
            yield from s.appending(EventType.TOOL_CALLED, payload_ref=args_ref, request_hash=request_hash,
                                   **common)
        if not deadline and timeout is not None:
            deadline = int(time.time() * 1000 + timeout * 1000)
        attrs = {"signal": signal, "deadline_ms": str(deadline), "on_timeout": on_timeout}
        yield from s.appending(EventType.RUN_WAITING, confirm=True, attributes=attrs, **common)
        raise RunWaits(s.run_id, call_id, signal, deadline)

    # -- a durable timer ------------------------------------------------------------------------

    def _sleep_steps(self, request: Mapping[str, Any]) -> Steps[None]:
        """``ctx.sleep`` / ``ctx.sleep_until``: ``request`` is ``{"seconds": s}`` or ``{"until_ms": t}``.

        The wake time is decided once, when the sleep's ``TOOL_CALLED`` is first appended (its
        arguments artifact holds ``wake_at_ms``); a re-run of the stage reads it back from the log (or
        from the wait's deadline), so a resume never sleeps twice nor longer. With more than
        :data:`INLINE_SLEEP_S` left, ``RUN_WAITING`` (signal :data:`SLEEP`, deadline = the wake time)
        is appended and the run let go; the resumers wake it at that time. The sleep's end is
        recorded (``SIGNAL_RECEIVED`` when the run waited, else ``TOOL_RESULT``), so a later re-run
        of the stage goes straight on."""
        index = self.positions.claim()
        s = self.session
        call_id = f"{self.stage}/{SLEEP}/{index}"
        common: dict[str, Any] = {"stage": self.stage, "tool": SLEEP, "call_id": call_id,
                                  "replay_policy": ReplayPolicy.SAFE}
        request_hash = self.store.digest(canonical_json(dict(request)))
        rec = self._at_index.get(index)
        wake: int | None = None
        if rec is not None:
            yield from self._guard(rec, call_id, _SLEEP_TOOL, request_hash, common)
            if rec.result is not None:  # slept already (or woken early by a signal)
                self.stored.add(rec.result)
                return None
            wake = self._deadlines.get(call_id) or None
            if wake is None and rec.args is not None:
                recorded = json.loads((yield from io(self.store.get, self.store.aget, rec.args)))
                at = recorded.get("wake_at_ms") if isinstance(recorded, dict) else None
                wake = at if isinstance(at, int) else None
        if wake is None:
            wake = int(request["until_ms"]) if "until_ms" in request else \
                int(time.time() * 1000) + max(0, round(float(request["seconds"]) * 1000))
        if rec is None:
            args_ref = yield from self.stored.put(canonical_json({**request, "wake_at_ms": wake}))
            yield from s.appending(EventType.TOOL_CALLED, payload_ref=args_ref, request_hash=request_hash,
                                   attributes={"wake_at_ms": str(wake)}, **common)
        left_ms = wake - int(time.time() * 1000)
        if left_ms > INLINE_SLEEP_S * 1000:
            attrs = {"signal": SLEEP, "deadline_ms": str(wake), "on_timeout": "default"}
            yield from s.appending(EventType.RUN_WAITING, confirm=True, attributes=attrs, **common)
            raise RunWaits(s.run_id, call_id, SLEEP, wake)
        if left_ms > 0:
            yield from Sleep(left_ms / 1000)
        woke = int(time.time() * 1000)
        ref = yield from self.stored.put(canonical_json({"wake_at_ms": wake, "woke_at_ms": woke}))
        if call_id in self._deadlines:  # the run waited: the wait's end, as a timed-out wait's
            yield from s.appending(EventType.SIGNAL_RECEIVED, payload_ref=ref,
                                   attributes={"signal": SLEEP, "timed_out": "true"}, **common)
        else:
            yield from s.appending(EventType.TOOL_RESULT, payload_ref=ref, **common)
        return None

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
        self.positions.fail(err)
        yield from self.session.appending(
            EventType.CALL_DIVERGED, request_hash=request_hash, error=ErrorInfo("Diverged", str(err), False),
            attributes={"recorded_call_id": rec.call_id, "recorded_tool": rec.tool or "",
                        "recorded_request_hash": rec.request_hash or ""}, **common)
        raise err

