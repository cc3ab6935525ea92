"""``runlog budget``: raise (or set) a run's budget, an operator event on the log like ``approve``.

It takes the run's lease at a new epoch (``LEASE_ACQUIRED`` with who and what), appends
``SIGNAL_RECEIVED`` of signal ``runlog.budget`` whose attributes carry the new caps (``tokens``,
``cost_nanos``, ``soft_tokens``, ``soft_cost_nanos``; a cap not given is kept), who and why, releases
the lease, and asks the resumer group for a resume when the run waits at its cap or failed on it
(``on_exceeded="fail"``: ``BudgetExceeded``). The fold applies
the caps (:mod:`runlog.projections._budget`); the resumed run checks its next model call against them.

Refused, with nothing appended, for a settled run (completed or cancelled), without ``--by`` or
``--reason``, or with no cap to set.
"""

from __future__ import annotations

from runlog.processors.operate import OperatorRefused, OperatorResult, _load, _runner, _who, _why, take_lease
from runlog.producers import Budget
from runlog.producers.internal import LeaseHeld
from runlog.projections import RunStatus
from runlog.projections.internal import BUDGET_SIGNAL
from runlog.schemas import EventType, Settings, WorkflowDefinitionError

__all__ = ["raise_budget"]


def raise_budget(settings: Settings, run_id: str, *, tokens: int | None = None, cost_usd: float | None = None,
                 soft_tokens: int | None = None, soft_cost_usd: float | None = None, by: str,
                 reason: str) -> OperatorResult:
    """Set the caps given (the others are kept) and resume the run if it waits at its cap or failed on it.

    Raises:
        OperatorRefused: see the module docstring (nothing appended).
    """
    who, why = _who(by), _why(reason)
    try:
        caps = Budget(tokens, cost_usd, soft_tokens, soft_cost_usd).caps()
    except WorkflowDefinitionError as err:
        raise OperatorRefused(str(err)) from err
    given = {k: v for k, v in (("tokens", caps.tokens), ("cost_nanos", caps.cost_nanos),
                               ("soft_tokens", caps.soft_tokens), ("soft_cost_nanos", caps.soft_cost_nanos))
             if v is not None}
    if not given:
        raise OperatorRefused("give a cap to set: --tokens, --cost-usd, --soft-tokens or --soft-cost-usd")
    state = _load(settings, run_id)
    if state.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
        raise OperatorRefused(f"run {run_id} is {state.status.value}: its budget no longer matters")
    # a run that waits for its budget, or that failed on it (on_exceeded="fail"), goes on once it is
    # raised: the lease taken here leaves the failed one resumable, and a resume is requested for both
    waits = (state.waiting is not None and state.waiting.signal == BUDGET_SIGNAL) or (
        state.status is RunStatus.FAILED and state.last_error is not None
        and state.last_error.kind == "BudgetExceeded")
    with _runner(settings) as r:
        try:
            taken = take_lease(settings, r, state, by=who, action="budget", reason=why, force=False)
        except LeaseHeld as err:
            raise OperatorRefused(f"run {run_id} is being executed right now ({err}); try again") from err
        if taken is None:
            raise OperatorRefused(f"run {run_id} moved while its budget was being set; try again")
        session, _ = taken
        try:
            caps_set = {k: str(v) for k, v in given.items()}
            attrs = {"signal": BUDGET_SIGNAL, "by": who, "reason": why, **caps_set}
            res = session.append(EventType.SIGNAL_RECEIVED, confirm=True, attributes=attrs)
        finally:
            session.close(release=True)
        if waits:
            r.writer.request_resume(run_id, f"budget raised by {who}", seen_epoch=session.epoch)
    what = ", ".join(f"{k}={v}" for k, v in given.items())
    return OperatorResult(run_id, "budget", session.epoch, res.event.seq,
                          f"budget set ({what}){'; resume requested' if waits else ''}")
