"""Child runs (``ctx.start_child``): a stage starts another run of its own, and waits for its outcome
holding no lease and no thread.

A child is a run like any other (its own log, lease, resume, branch and audit), started with a keyed
start, so starting it is exactly once: its run key is ``runlog.child:<parent run id>:<call id>``
(``:<key>`` appended when the stage gives one), and a keyed start of an existing run returns that
run. The parent's stage records the start as a call at its position (tool :data:`CHILD`):

* ``TOOL_CALLED`` (arguments: workflow, version, params, key; ``idempotency_key``: the child's run
  key; attribute ``runlog.child_run_id``) is appended first, then the child is started
  (``RUN_STARTED`` with ``parent_run_id`` and the attribute ``runlog.parent_call``) and handed to the
  App's resumer group with a resume request (the parent's process need not stay alive). A parent
  resumed after a crash makes the same call at the same position, which starts the same key: it
  finds its child, never a second one.
* ``handle.result()`` / ``ctx.gather(*handles)`` read the children's states (the projection, and the
  log for a child the projection does not show ended). Every child that has ended gets its outcome
  recorded as the call's result (``TOOL_RESULT``; ``SIGNAL_RECEIVED`` for the call the run waited
  at), once: a later re-run of the stage reads it back. While any awaited child goes on,
  ``RUN_WAITING`` (signal :data:`CHILD`, attribute ``runlog.children``: the children it waits for) is
  appended and the run let go, as ``ctx.wait_for`` does.
* A child's end asks for its parent's resume; a resumer resumes a run waiting for children only once
  all of them have ended, and its sweep looks for such runs (a request lost to a crash).

Outcomes: ``COMPLETED`` gives a :class:`~runlog.producers.RunResult` (the child's stage outputs);
``FAILED`` raises :class:`~runlog.schemas.errors.RunFailed` and ``CANCELLED``
:class:`~runlog.schemas.errors.RunCancelled` (both recorded: a re-run raises them again); ``BLOCKED``
raises :class:`~runlog.schemas.errors.ResumeBlocked` and blocks the parent's stage too, without
recording the child's outcome, so ``runlog retry`` of the parent, once the child is settled, looks
again.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runlog.producers.base._protocol import Steps, io
from runlog.producers.calls._call_budget import BudgetGuard
from runlog.producers.calls._calls import RunWaits, _sources_fn
from runlog.producers.calls._keys import canonical_json
from runlog.producers.define._tools import Tool
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._session import RunSession
from runlog.producers.run._outcome import ENDED, RunOutcomes
from runlog.producers.run._results import RunResult
from runlog.producers.run._runs import run_id_for_key
from runlog.producers.run._start import RunStarts
from runlog.projections import RunState, RunStatus
from runlog.projections.internal import CHILD_USAGE_ATTRIBUTE, SOFT_ATTRIBUTE
from runlog.schemas import EventType, ReplayPolicy
from runlog.schemas.errors import ResumeBlocked, RunCancelled, RunFailed, RunlogError, WorkflowDefinitionError
from runlog.schemas.internal import CHILD_RUN_ATTRIBUTE, CHILD_TOOL, CHILDREN_ATTRIBUTE, PARENT_CALL_ATTRIBUTE

if TYPE_CHECKING:
    from runlog.producers.calls._call_steps import _ContextCore

__all__ = ["CHILD", "ChildRuns", "child_key", "children_ended", "gathering", "outcome_of", "starting_child"]

CHILD = CHILD_TOOL
"""The tool name of a child run's position in its parent's stage."""

_CHILD = Tool(CHILD, _sources_fn("never"), ReplayPolicy.IDEMPOTENT)
"""A child call's position as the determinism guard sees it (its function is never called)."""


def child_key(parent_run_id: str, call_id: str, key: str | None) -> str:
    """The run key of the child started at ``call_id`` of ``parent_run_id`` (with the stage's ``key``)."""
    base = f"runlog.child:{parent_run_id}:{call_id}"
    return base if key is None else f"{base}:{key}"


class ChildRuns:
    """Starts child runs and reads their ends (a runner's part the stage contexts use).

    Args:
        starts: the runner's start procedure (keyed starts).
        outcomes: where children's states are read (the projection, else the log).
    """

    def __init__(self, starts: RunStarts, outcomes: RunOutcomes) -> None:
        self.starts = starts
        self.outcomes = outcomes

    def start(self, workflow: Workflow, params: Mapping[str, Any], key: str, parent: RunSession,
              call_id: str) -> Steps[str]:
        """Start the child (exactly once by ``key``) and hand a new one to the resumer group; its run id."""
        handle = yield from self.starts.start(workflow, params, None, key, parent.run_id, None, None,
                                              {PARENT_CALL_ATTRIBUTE: call_id}, parent.subject)
        if handle.session is not None:  # new: the group executes it (this process may die meanwhile)
            yield from handle.session.closing(release=True)
            w = self.starts.writer
            yield from io(w.request_resume, w.arequest_resume, handle.run_id,
                          f"child of {parent.run_id} ({call_id})")
        return handle.run_id

    def ended(self, run_id: str, confirm: bool) -> RunState | None:
        """The child's state once it has ended (None: it goes on, or is not on the log yet). With
        ``confirm``, a child the projection does not show ended is looked up on the log (the
        projection may be behind it)."""
        state = self.outcomes.state(run_id)
        if (state is None or state.status not in ENDED) and confirm and self.outcomes.projected is not None:
            state = self.outcomes.state(run_id, from_log=True)
        return state if state is not None and state.status in ENDED else None

    async def aended(self, run_id: str, confirm: bool) -> RunState | None:
        """:meth:`ended` off the loop."""
        return await asyncio.to_thread(self.ended, run_id, confirm)

    def outputs(self, state: RunState) -> dict[str, Any]:
        """A completed child's stage outputs."""
        return self.outcomes.outcome(state).outputs


def children_ended(outcomes: RunOutcomes, state: RunState) -> bool:
    """Whether ``state`` is a run waiting for children (``RUN_WAITING`` signal :data:`CHILD`) all of which
    have ended: the projection's state of each, the log's for one it does not show ended."""
    w = state.waiting
    if state.status is not RunStatus.WAITING or w is None or w.signal != CHILD or not w.children:
        return False
    for child in w.children:
        s = outcomes.state(child)
        if (s is None or s.status not in ENDED) and outcomes.projected is not None:
            s = outcomes.state(child, from_log=True)
        if s is None or s.status not in ENDED:
            return False
    return True


def starting_child(core: _ContextCore, children: ChildRuns | None, workflow: Workflow,
                   params: Mapping[str, Any], key: str | None,
                   index: int | None = None) -> Steps[tuple[int, str, str]]:
    """The steps of ``ctx.start_child``: ``(index, call id, child run id)``; at the stage's next call
    position, or at ``index`` (a position taken ahead, :meth:`CallPosition.start_child`)."""
    if children is None:
        raise WorkflowDefinitionError("this runner cannot start child runs (no run key store): use a "
                                      "Runner.from_settings runner, a resumer or InMemoryWorld")
    if not isinstance(workflow, Workflow):
        raise WorkflowDefinitionError(f"start_child() needs a Workflow, got {type(workflow).__name__}")
    if key is not None and (not isinstance(key, str) or not key):
        raise WorkflowDefinitionError(f"start_child(key=...) must be a non-empty string, got {key!r}")
    if not isinstance(params, Mapping):
        raise WorkflowDefinitionError(f"start_child() params must be a JSON object, "
                                      f"got {type(params).__name__}")
    if index is None:
        index = core.positions.claim()
    s = core.session
    call_id = f"{core.stage}/{CHILD}/{index}"
    run_key = child_key(s.run_id, call_id, key)
    child_id = run_id_for_key(run_key)
    args = {"workflow": workflow.name, "version": workflow.version, "params": dict(params), "key": key}
    args_bytes = canonical_json(args)
    request_hash = core.store.digest(args_bytes)
    common: dict[str, Any] = {"stage": core.stage, "tool": CHILD, "call_id": call_id,
                              "replay_policy": ReplayPolicy.IDEMPOTENT}
    rec = core._at_index.get(index)
    if rec is not None:
        yield from core._guard(rec, call_id, _CHILD, request_hash, common)
        if rec.result is not None:
            return index, call_id, child_id  # its outcome is recorded: nothing to start
    else:
        yield from core._verify()  # a writer whose lease was taken starts no child
        args_ref = yield from core.stored.put(args_bytes)
        yield from s.appending(EventType.TOOL_CALLED, payload_ref=args_ref, request_hash=request_hash,
                               idempotency_key=run_key, attributes={CHILD_RUN_ATTRIBUTE: child_id}, **common)
    yield from s.crashing(f"before:CHILD:{call_id}")
    started = yield from children.start(workflow, params, run_key, s, call_id)
    yield from s.crashing(f"after:CHILD:{call_id}")
    return index, call_id, started


def outcome_of(doc: Mapping[str, Any]) -> RunResult:
    """A recorded child outcome as what ``handle.result()`` gives.

    Raises:
        RunFailed, RunCancelled: the child ended so.
    """
    run_id = str(doc.get("run_id", ""))
    status = doc.get("status")
    if status == RunStatus.FAILED.value:
        raise RunFailed(run_id, str(doc.get("kind", "unknown")), str(doc.get("message", "")),
                        bool(doc.get("retryable", False)))
    if status == RunStatus.CANCELLED.value:
        raise RunCancelled(run_id, str(doc.get("message", "cancelled")))
    return RunResult(run_id, int(doc.get("epoch", 0)), int(doc.get("last_seq", 0)),
                     dict(doc.get("outputs") or {}), completed=True)


def _doc(state: RunState, children: ChildRuns) -> dict[str, Any]:
    err = state.last_error
    doc: dict[str, Any] = {"run_id": state.run_id, "status": state.status.value, "epoch": state.epoch,
                           "last_seq": state.last_seq}
    if state.status is RunStatus.COMPLETED:
        doc["outputs"] = children.outputs(state)
    else:
        doc.update(kind=err.kind if err else "unknown", message=err.message if err else "",
                   retryable=err.retryable if err else False)
    return doc


def gathering(core: _ContextCore, children: ChildRuns | None, handles: Sequence[tuple[int, str, str]],
              return_exceptions: bool) -> Steps[list[Any]]:
    """The steps of ``handle.result()`` and ``ctx.gather``: each handle's outcome, in order, once every
    one has ended (see the module docstring); meanwhile the run waits for the pending ones."""
    assert children is not None  # a handle exists only where start_child worked
    s = core.session
    docs: dict[str, dict[str, Any]] = {}
    pending: list[tuple[str, str]] = []  # (call id, child run id)
    blocked: list[RunState] = []
    for index, call_id, child_id in handles:
        if call_id in docs or any(c == call_id for c, _ in pending):
            continue
        rec = core._at_index.get(index)
        if rec is not None and rec.result is not None:  # recorded already: what the parent saw then
            core.stored.add(rec.result)
            docs[call_id] = json.loads((yield from io(core.store.get, core.store.aget, rec.result)))
            continue
        state = yield from io(children.ended, children.aended, child_id, not pending)
        if state is None:
            pending.append((call_id, child_id))
            continue
        if state.status is RunStatus.BLOCKED:
            blocked.append(state)
            continue
        doc = yield from io(_doc, _adoc, state, children)
        ref = yield from core.stored.put(canonical_json(doc))
        common: dict[str, Any] = {"stage": core.stage, "tool": CHILD, "call_id": call_id,
                                  "replay_policy": ReplayPolicy.IDEMPOTENT}
        spent = state.total_usage  # the child's own and its children's: reaches the parent once, here
        attrs = {CHILD_RUN_ATTRIBUTE: child_id, "status": state.status.value}
        if spent.calls:
            attrs[CHILD_USAGE_ATTRIBUTE] = spent.to_json()
            guard: BudgetGuard | None = getattr(s, "budget", None)  # the parent's budget counts it
            warning = guard.add_totals(spent) if guard is not None else None
            if warning is not None:
                attrs[SOFT_ATTRIBUTE] = warning
        if call_id in core._deadlines:  # the call the run waited at: the wait's end
            yield from s.appending(EventType.SIGNAL_RECEIVED, payload_ref=ref,
                                   attributes={"signal": CHILD, **attrs}, **common)
        else:
            yield from s.appending(EventType.TOOL_RESULT, payload_ref=ref, attributes=attrs, **common)
        docs[call_id] = doc
    if pending:
        call_id = pending[0][0]
        attrs = {"signal": CHILD, "deadline_ms": "0", "on_timeout": "fail",
                 CHILDREN_ATTRIBUTE: ",".join(c for _, c in pending)}
        yield from s.appending(EventType.RUN_WAITING, confirm=True, attributes=attrs, stage=core.stage,
                               tool=CHILD, call_id=call_id, replay_policy=ReplayPolicy.IDEMPOTENT)
        raise RunWaits(s.run_id, call_id, CHILD, 0)
    if blocked:
        b = blocked[0]
        why = b.last_error.message if b.last_error is not None else "no reason recorded"
        err = ResumeBlocked(s.run_id, f"child run {b.run_id} is blocked ({why}); settle it, then "
                                      f"runlog retry {s.run_id}")
        core.positions.fail(err)
        raise err
    out: list[Any] = []
    first: RunlogError | None = None
    for _, call_id, _ in handles:
        try:
            out.append(outcome_of(docs[call_id]))
        except (RunFailed, RunCancelled) as err:
            first = first or err
            out.append(err)
    if first is not None and not return_exceptions:
        raise first
    return out


async def _adoc(state: RunState, children: ChildRuns) -> dict[str, Any]:
    return await asyncio.to_thread(_doc, state, children)
