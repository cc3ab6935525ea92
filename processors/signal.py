"""Signals for waiting runs: ``runlog signal RUN NAME --data JSON``, ``runlog approve`` / ``reject``.

A run whose stage called ``ctx.wait_for(NAME)`` is ``WAITING``: no writer, no lease, no
thread. A signal is an operator event like the others (people act through the log): it
takes the run's lease at a new epoch (``LEASE_ACQUIRED`` with who and what), appends
``SIGNAL_RECEIVED`` with the data as an artifact (attributes ``signal``, ``by``, ``reason``),
releases the lease and asks the resumer group for a resume. The fold records the data as
the wait's result, so the resumed stage gets it back from ``wait_for`` and every later
resume reuses it.

A signal is refused, with nothing appended, when the run is not waiting, waits for another
signal, or nobody is named (``--by``).
"""

from __future__ import annotations

import json
from typing import Any

from runlog.processors.operate import OperatorRefused, OperatorResult, load_run, take_lease
from runlog.producers import Runner
from runlog.producers.internal import WAIT, LeaseHeld, canonical_json
from runlog.projections import RunStatus
from runlog.schemas import EventType, ReplayPolicy, Settings, WorkflowDefinitionError

__all__ = ["APPROVAL", "approve_run", "parse_data", "reject_run", "signal_run"]

APPROVAL = "approval"
"""The signal ``runlog approve`` / ``reject`` send unless told otherwise."""


def signal_run(settings: Settings, run_id: str, name: str, data: Any, *, by: str, reason: str = "",
               runner: Runner | None = None) -> OperatorResult:
    """Deliver signal ``name`` with ``data`` (JSON) to a waiting run and request its resume.

    Raises:
        OperatorRefused: the run is not waiting for ``name``, or ``by`` is empty (nothing appended).
    """
    if not by or not by.strip():
        raise OperatorRefused("say who is acting: --by is required")
    try:
        payload = canonical_json(data)
    except WorkflowDefinitionError as err:
        raise OperatorRefused(f"the signal's data must be JSON: {err}") from err
    state = load_run(settings, run_id)
    if state is None:
        raise OperatorRefused(f"no run {run_id!r} in Redis or on the events topic")
    w = state.waiting
    if state.status is not RunStatus.WAITING or w is None:
        raise OperatorRefused(f"run {run_id} is {state.status.value}, not waiting for a signal")
    if w.signal != name:
        raise OperatorRefused(f"run {run_id} waits for signal {w.signal!r}, not {name!r}")
    own = runner is None
    r = runner or Runner.from_settings(settings)
    try:
        try:
            taken = take_lease(settings, r, state, by=by, action=f"signal:{name}", reason=reason, force=False)
        except LeaseHeld as err:
            raise OperatorRefused(f"run {run_id} is being resumed right now ({err}); try again") from err
        if taken is None:
            raise OperatorRefused(f"run {run_id} moved while the signal was being delivered; try again")
        session, _ = taken
        try:
            ref = r.store.for_subject(state.subject).put(payload, "application/json")
            res = session.append(EventType.SIGNAL_RECEIVED, confirm=True, stage=w.call_id.split("/", 1)[0],
                                 tool=WAIT, call_id=w.call_id, replay_policy=ReplayPolicy.SAFE,
                                 payload_ref=ref, attributes={"signal": name, "by": by, "reason": reason})
        finally:
            session.close(release=True)
        r.writer.request_resume(run_id, f"signal {name} from {by}", seen_epoch=session.epoch)
    finally:
        if own:
            r.close()
    return OperatorResult(run_id, f"signal:{name}", session.epoch, res.event.seq,
                          f"signal {name!r} delivered ({len(payload)} bytes of data); resume requested")


def approve_run(settings: Settings, run_id: str, *, by: str, reason: str = "", name: str = APPROVAL,
                runner: Runner | None = None) -> OperatorResult:
    """``signal_run(name, {"approved": true})``."""
    return signal_run(settings, run_id, name, {"approved": True}, by=by, reason=reason, runner=runner)


def reject_run(settings: Settings, run_id: str, *, by: str, reason: str = "", name: str = APPROVAL,
               runner: Runner | None = None) -> OperatorResult:
    """``signal_run(name, {"approved": false})``."""
    return signal_run(settings, run_id, name, {"approved": False}, by=by, reason=reason, runner=runner)


def parse_data(text: str) -> Any:
    """``--data`` as JSON (a clear refusal otherwise)."""
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise OperatorRefused(f"--data is not JSON: {err}") from err
