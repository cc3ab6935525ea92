"""Executing a run's stages, as protocol steps both runners drive (also for an existing run,
which resume continues); starting is :mod:`runlog.producers.run._start`.

Event sequence of a run, all at the session's epoch (delivery: see
:mod:`runlog.producers.log._writer`)::

    RUN_STARTED (confirmed)          workflow spec, input_versions, params artifact
    per stage:
      STAGE_STARTED
      per tool call: TOOL_CALLED [EFFECT_INTENT (confirmed) ... EFFECT_RESULT] TOOL_RESULT
      VERIFIED (rules passed; output + artifacts)  |  FAILED (rules, stage error or tool error)
      (flush: everything so far acknowledged)
    RUN_COMPLETED (then flush, lease released)
    RUN_BLOCKED (confirmed)          instead, when a call diverged or an effect is in doubt
"""

from __future__ import annotations

import contextlib
import json
import logging
from collections.abc import Mapping
from typing import Any

import redis

from runlog.producers.base._protocol import (
    Invoke,
    Mode,
    Steps,
    io,
    is_async_fn,
)
from runlog.producers.base._trace import Span, Tracer, context_of
from runlog.producers.calls._artifacts import ArtifactStore, is_inline
from runlog.producers.calls._calls import RecordedCall, RunWaits, StageOutputs, error_info, require_mapping
from runlog.producers.calls._keys import canonical_json
from runlog.producers.calls._ledger import EffectLedger, LedgerUnavailable
from runlog.producers.calls._limiter import Limiter
from runlog.producers.define._prices import PriceTable
from runlog.producers.define._workflow import Stage, evaluate_rules
from runlog.producers.log._session import AppendResult, RunSession
from runlog.producers.run._active import ActiveRuns
from runlog.producers.run._children import ChildRuns
from runlog.producers.run._context import AsyncStageContext, StageContext
from runlog.producers.run._results import RunResult
from runlog.producers.run._start import deactivating
from runlog.schemas import ArtifactRef, ErrorInfo, EventType
from runlog.schemas.errors import (
    DeliveryError,
    LeaseLost,
    ResumeBlocked,
    RunlogError,
    VerificationFailed,
    WorkflowDefinitionError,
)

__all__ = ["STAGE_OUTPUT_MEDIA_TYPE", "StageExecution"]

STAGE_OUTPUT_MEDIA_TYPE = "application/vnd.runlog.stage-output+json"

log = logging.getLogger("runlog.runner")


class StageExecution:
    """Executing a run's stages as steps (a runner's part): the stage contexts it builds get the
    store, the ledger, the tracer and the prices.

    Args:
        store: the artifact store.
        ledger: the effects ledger shared by all runs (consulted before every effect).
        max_parallel: threads per stage for ``ctx.submit`` / ``ctx.parallel``.
        active: the registry of active runs (a run that ended or waits leaves it).
        tracer: spans per run, stage and call.
        prices: the price table of the model calls stages make.
        limiter: counts the calls of tools with a rate limit (None: not counted).
        children: starts child runs and reads their ends (``ctx.start_child``).
    """

    def __init__(self, store: ArtifactStore, *, ledger: EffectLedger | None, max_parallel: int,
                 active: ActiveRuns | None, tracer: Tracer, prices: PriceTable,
                 limiter: Limiter | None = None, children: ChildRuns | None = None) -> None:
        self.store = store
        self.children = children
        """Starts the child runs stages ask for (``ctx.start_child``); None: they cannot."""
        self.ledger = ledger
        self.max_parallel = max_parallel
        self.active = active
        self.tracer = tracer
        self.prices = prices
        self.limiter = limiter

    def execute(self, session: RunSession, from_stage: str | None,
                stage_outputs: Mapping[str, Mapping[str, Any] | ArtifactRef] | None,
                recorded_calls: Mapping[str, RecordedCall | ArtifactRef] | None,
                reconciled: Mapping[str, Mapping[str, Any]] | None, complete: bool, release: bool,
                deadlines: Mapping[str, int] | None, modes: tuple[Mode, Mode]) -> Steps[RunResult]:
        """The steps of :meth:`Runner.execute`; ``modes``: those of a ``def`` stage's and an ``async def``
        stage's context."""
        wf = session.workflow
        store = self.store.for_subject(session.subject)  # payloads sealed for the run's subject
        outputs = StageOutputs(store, stage_outputs or {})
        names = [s.name for s in wf.stages]
        start = from_stage or next((n for n in names if n not in outputs), None)
        if start is not None and start not in names:
            raise WorkflowDefinitionError(f"workflow {wf.name!r} has no stage {start!r}")
        todo = wf.stages[names.index(start):] if start is not None else ()
        span, session.run_span = session.run_span, None  # the one the start opened, if any
        if span is None:
            span = self.tracer.start("run", wf.name, None, {"run_id": session.run_id, "workflow": wf.name,
                                                             "epoch": session.epoch})
            session.trace = context_of(span) or session.trace
        outcome = "stopped"
        error: BaseException | None = None
        try:
            for stage in todo:
                outputs[stage.name] = yield from self._stage_steps(
                    session, stage, store, outputs, recorded_calls or {}, reconciled or {}, deadlines or {},
                    span, modes)
            if complete:
                yield from session.appending(EventType.RUN_COMPLETED)
            yield from session.closing(release=release)
            if complete:
                yield from deactivating(self.active, session.run_id)
                yield from waking_parent(session, "completed")
            outcome = "completed" if complete else "stopped"
        except LeaseLost as err:
            session.closed = True  # not ours any more: nothing to flush or release
            error = err
            raise
        except RunWaits as w:  # RUN_WAITING is acknowledged: let the run go until its signal
            yield from session.closing(release=True)
            if self.active is not None:
                with contextlib.suppress(redis.RedisError):
                    yield from io(self.active.wait, self.active.await_, session.run_id, wf.name,
                                  w.deadline_ms)
            outcome = "waiting"
            return RunResult(session.run_id, session.epoch, session.last_seq, outputs.as_dict(), False,
                             w.signal)
        except ResumeBlocked as err:
            outcome, error = "blocked", err
            with contextlib.suppress(RunlogError):
                yield from session.appending(EventType.RUN_BLOCKED, confirm=True,
                                             error=ErrorInfo(type(err).__name__, err.reason, False))
                yield from session.closing(release=release)
                yield from deactivating(self.active, session.run_id)
                yield from waking_parent(session, "blocked")
            raise
        except DeliveryError as err:
            error = err
            with contextlib.suppress(RunlogError):
                yield from session.closing(release=release)
            raise  # the run is still RUNNING on the log: it stays active for the sweep
        except Exception as err:  # a stage failed: FAILED is on the log
            outcome, error = "failed", err
            with contextlib.suppress(RunlogError):
                yield from session.closing(release=release)
                yield from deactivating(self.active, session.run_id)
                yield from waking_parent(session, "failed")
            raise
        except BaseException as err:
            error = err
            with contextlib.suppress(RunlogError):
                yield from session.closing(release=release)
            raise
        finally:
            span.set("seq", session.last_seq)
            span.set("outcome", outcome)
            span.end(error)
        return RunResult(session.run_id, session.epoch, session.last_seq, outputs.as_dict(), complete)

    def _stage_steps(self, s: RunSession, stage: Stage, store: ArtifactStore, outputs: StageOutputs,
                     recorded: Mapping[str, RecordedCall | ArtifactRef],
                     reconciled: Mapping[str, Mapping[str, Any]], deadlines: Mapping[str, int],
                     run_span: Span, modes: tuple[Mode, Mode]) -> Steps[dict[str, Any]]:
        started: AppendResult = yield from s.appending(EventType.STAGE_STARTED, stage=stage.name)
        span = self.tracer.start("stage", stage.name, run_span, {
            "run_id": s.run_id, "stage": stage.name, "epoch": s.epoch, "seq": started.event.seq})
        try:
            out = yield from self._stage_body(s, stage, store, outputs, recorded, reconciled, deadlines, span,
                                              modes)
        except RunWaits:
            span.set("outcome", "waiting")
            span.end()
            raise
        except BaseException as err:
            span.set("outcome", "blocked" if isinstance(err, ResumeBlocked) else "failed")
            span.end(err)
            raise
        span.set("outcome", "verified")
        span.end()
        return out

    def _stage_body(self, s: RunSession, stage: Stage, store: ArtifactStore, outputs: StageOutputs,
                    recorded: Mapping[str, RecordedCall | ArtifactRef],
                    reconciled: Mapping[str, Mapping[str, Any]], deadlines: Mapping[str, int],
                    span: Span, modes: tuple[Mode, Mode]) -> Steps[dict[str, Any]]:
        is_async = is_async_fn(stage.fn)
        sync_mode, async_mode = modes
        kind = AsyncStageContext if is_async else StageContext
        ctx = kind(s, stage.name, store, outputs, recorded_calls=recorded, reconciled=reconciled,
                   max_parallel=self.max_parallel, ledger=self.ledger, deadlines=deadlines,
                   mode=async_mode if is_async else sync_mode, tracer=self.tracer, span=span,
                   prices=self.prices, limiter=self.limiter)
        ctx.children = self.children
        yield from s.crashing(f"inside:STAGE:{stage.name}")
        try:
            inputs = s.inputs.load(stage.inputs)
            run_stage = _run_async_stage if is_async else _run_sync_stage
            raw = yield from Invoke(run_stage, (stage.fn, ctx, inputs))
            if ctx.failure is not None:
                raise ctx.failure  # the stage swallowed a failed tool call: it still failed
            out_bytes = canonical_json(require_mapping(stage.name, raw))
        except (LeaseLost, DeliveryError, LedgerUnavailable):
            raise  # the writer lets go as a crash would: no FAILED, a resumer continues the run
        except ResumeBlocked:
            if isinstance(ctx.failure, ResumeBlocked):
                raise ctx.failure from None
            raise
        except Exception as err:  # recorded as FAILED (unless a tool call already did), re-raised
            if isinstance(ctx.failure, ResumeBlocked):  # the stage swallowed it, then failed otherwise
                raise ctx.failure from err
            if ctx.failure is None:
                yield from s.appending(EventType.FAILED, stage=stage.name, error=error_info(err))
            yield from s.flushing()
            raise
        out: dict[str, Any] = json.loads(out_bytes)
        results = evaluate_rules(stage.rules, out)
        out_ref = yield from ctx.stored.put(out_bytes, STAGE_OUTPUT_MEDIA_TYPE)
        refs = (*[a for a in ctx.artifacts if a.sha256 != out_ref.sha256],
                *(() if is_inline(out_ref) else (out_ref,)))  # an inline output is in payload_ref already
        failed = [r for r in results if not r.passed]
        if failed:
            msg = "; ".join(f"{r.rule}: {r.detail}" for r in failed)
            yield from s.appending(EventType.FAILED, stage=stage.name, verification=tuple(results),
                                   payload_ref=out_ref, artifact_refs=refs,
                                   error=ErrorInfo("VerificationFailed", msg))
            yield from s.flushing()
            raise VerificationFailed(stage.name, [r.rule for r in failed])
        yield from s.appending(EventType.VERIFIED, stage=stage.name, verification=tuple(results),
                               payload_ref=out_ref, artifact_refs=refs)
        yield from s.flushing()
        return out


def waking_parent(session: RunSession, outcome: str) -> Steps[None]:
    """A child run ended (``outcome``): ask for its parent's resume, the parent waits for it. A request
    lost (this process dies first, the topic refuses it) is made up for by the resumers' sweep, which
    looks for runs whose awaited children have all ended."""
    if session.parent is None:
        return
    parent, call_id = session.parent
    yield from session.crashing(f"before:WAKE:{call_id}")
    w = session.writer
    try:
        yield from io(w.request_resume, w.arequest_resume, parent,
                      f"child {session.run_id} {outcome} ({call_id})")
    except RunlogError as err:
        log.warning("child %s: its parent %s not asked to resume (%s); the sweep will", session.run_id,
                    parent, err)


def _run_sync_stage(fn: Any, ctx: StageContext, inputs: Any) -> Any:
    try:
        return fn(ctx, inputs)
    finally:
        ctx.finish()


async def _run_async_stage(fn: Any, ctx: AsyncStageContext, inputs: Any) -> Any:
    try:
        return await fn(ctx, inputs)
    finally:
        await ctx.finish()


_EXECUTE_DOC = """Execute the session's workflow from ``from_stage`` to the end.

        Args:
            session: a new run's session, or one from :meth:`take_over`.
            from_stage: the first stage to run (default: the first stage not in
                ``stage_outputs``).
            stage_outputs: outputs of already verified stages (dicts, or the
                ``payload_ref`` of their ``VERIFIED``), readable via ``ctx.output_of``.
            recorded_calls: the calls the log records for the stages to run (a
                :class:`RecordedCall`, or just the ``TOOL_RESULT`` payload_ref): a call
                with a recorded result is not made again and nothing is appended for
                it; any call at a recorded position must be the recorded call (the
                determinism guard, see :mod:`runlog.producers.calls._call_steps`).
            reconciled: ``call_id -> external record`` found by reconcile: not made
                again; one ``TOOL_RESULT`` (``source=reconciled``) is appended.
            complete: append ``RUN_COMPLETED`` after the last stage.
            release: release the lease at the end (also after a failed stage).
            deadlines: ``call_id -> deadline (ms)`` of the run's waits (``RunState.waiting``), so a
                resumed wait keeps its first deadline.

        Raises:
            VerificationFailed, ToolError, or the stage's own exception, after ``FAILED``
            was appended and flushed; ResumeBlocked (Diverged, EffectInDoubt) after
            ``RUN_BLOCKED`` was appended; LeaseLost / DeliveryError without appending.
        """

