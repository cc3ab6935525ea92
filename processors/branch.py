"""Explicit upgrade: branch a run with new input versions instead of changing them silently.

The branch is a new run (``parent_run_id``, ``forked_from_seq``) forked at the last
checkpoint before the first stage that reads a changed input. Its log starts with
``RUN_STARTED`` (the new pinned versions), ``RUN_BRANCHED`` (with the parent's model usage at the
fork, attribute ``runlog.usage.inherited``: the branch's totals start from it, shown apart from
what the branch spends itself), and one ``VERIFIED``
per inherited stage (the parent's verified outputs, attribute ``inherited_from``),
so it is resumable on its own; the affected stages then run and are verified
again. The parent run's log is not touched. The branch's effects go through the
ledger shared by all runs: an effect whose delivery key is done in the parent is
not executed again (its external id is reused), one in doubt in the parent is
handled by the tool's policy (a ``NEVER`` tool blocks the branch).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runlog.processors.inspect import run_history
from runlog.processors.resume import App
from runlog.producers import ArtifactStore, Runner
from runlog.producers.internal import sealing, store_from_settings
from runlog.projections.internal import INHERITED_ATTRIBUTE
from runlog.schemas import (
    ArtifactRef,
    ConfigError,
    DeliveryError,
    EventType,
    LeaseLost,
    ResumeBlocked,
    RuleResult,
    Settings,
)

__all__ = ["BranchResult", "branch_run"]


@dataclass(frozen=True)
class BranchResult:
    run_id: str
    parent_run_id: str
    forked_from_seq: int
    first_affected_stage: str
    inherited_stages: tuple[str, ...]
    rerun_stages: tuple[str, ...]
    completed: bool
    blocked_reason: str | None = None
    """Set when the branch blocked (``RUN_BLOCKED`` appended): e.g. an effect it would execute is
    done or in doubt in the parent run (one delivery key, one effect, whichever run asks)."""
    ran_stages: tuple[str, ...] = ()
    """The stages the branch ran and verified (read back from its log), in order: ``rerun_stages``
    is the plan, this is what happened (shorter when the branch blocked or failed)."""
    blocked_stage: str | None = None
    """The stage the branch blocked in, when it blocked."""
    failed_reason: str | None = None
    """Set when a stage of the branch failed (``FAILED`` on its log): the error's kind and message."""
    failed_stage: str | None = None
    """The stage that failed, when one did."""
    executed: bool = True
    """False when the branch was only created (``execute=False``): nothing ran."""

    @property
    def not_run_stages(self) -> tuple[str, ...]:
        """The planned stages the branch did not get to (after the one it blocked or failed in)."""
        stopped = self.blocked_stage or self.failed_stage
        if self.completed:
            return ()
        return tuple(s for s in self.rerun_stages if s not in self.ran_stages and s != stopped)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "parent_run_id": self.parent_run_id,
                "forked_from_seq": self.forked_from_seq, "first_affected_stage": self.first_affected_stage,
                "inherited_stages": list(self.inherited_stages), "rerun_stages": list(self.rerun_stages),
                "ran_stages": list(self.ran_stages), "not_run_stages": list(self.not_run_stages),
                "executed": self.executed, "completed": self.completed,
                "blocked_stage": self.blocked_stage, "blocked_reason": self.blocked_reason,
                "failed_stage": self.failed_stage, "failed_reason": self.failed_reason}

    def describe(self) -> str:
        """One line saying what happened (not the plan): the stages inherited, the ones the branch ran
        and verified, where it blocked or failed and why, and the planned stages it never ran."""
        ran = ", ".join(self.ran_stages) or "no stage"
        line = (f"branch {self.run_id} of {self.parent_run_id} forked at seq {self.forked_from_seq}: "
                f"inherited {', '.join(self.inherited_stages) or 'nothing'}")
        if not self.executed:
            return line + f"; created, not executed (it would run {', '.join(self.rerun_stages)})"
        line += f"; ran and verified {ran}"
        if self.completed:
            return line + "; completed"
        if self.blocked_reason is not None:
            line += f"; BLOCKED in {self.blocked_stage or '?'}: {self.blocked_reason}"
        elif self.failed_reason is not None:
            line += f"; FAILED in {self.failed_stage or '?'}: {self.failed_reason}"
        else:
            line += "; stopped"
        rest = self.not_run_stages
        return line + (f"; never ran {', '.join(rest)}" if rest else "") + "; NOT completed"


def branch_run(settings: Settings, app: App, parent_run_id: str, changes: Mapping[str, str], *,
               runner: Runner | None = None, artifacts: ArtifactStore | None = None,
               execute: bool = True) -> BranchResult:
    """Create (and by default execute) a branch of ``parent_run_id`` with ``changes`` pinned."""
    history = run_history(settings, parent_run_id)
    if not history:
        raise ConfigError(f"no run {parent_run_id!r} on the events topic")
    state = history[-1].state
    spec = state.workflow
    if spec is None:
        raise ConfigError(f"run {parent_run_id!r} has no workflow on its log")
    workflow = app.registry.get(spec.name, spec.version)
    unknown = set(changes) - set(workflow.input_names())
    if unknown:
        raise ConfigError(f"workflow {spec.name!r} reads no input named {', '.join(sorted(unknown))}")
    changed = {k for k, v in changes.items() if state.input_versions.get(k) != v}
    if not changed:
        raise ConfigError("every given input already has that version in the parent run")
    order = spec.stage_names
    first = next((s.name for s in spec.stages if changed & set(s.inputs)), None)
    if first is None:
        raise ConfigError(f"no stage reads {', '.join(sorted(changed))}")
    cut = order.index(first)
    fork_seq, inherited_state = 0, None
    for le in history:
        cp = le.outcome.checkpoint
        if cp is not None and cp.stage in order and order.index(cp.stage) < cut:
            fork_seq, inherited_state = cp.last_seq, le.state
    inherited: dict[str, ArtifactRef] = {}
    if inherited_state is not None:
        inherited = {s: ref for s, ref in inherited_state.stage_outputs.items()
                     if s in order and order.index(s) < cut}
    start = next(s for s in order if s not in inherited)  # == first unless a stage had no checkpoint
    store = sealing(artifacts, settings) if artifacts is not None \
        else store_from_settings(settings, inline=False)
    params: dict[str, Any] = {}
    if state.params_ref is not None:
        params = dict(json.loads(store.get(state.params_ref)))
    own = runner is None
    r = runner or Runner.from_settings(settings, source=app.source, store=store, prices=app.prices)
    try:
        pinned = {**state.input_versions, **changes}
        handle = r.start_run(workflow, params, pinned, parent_run_id=parent_run_id,
                             forked_from_seq=fork_seq, subject=state.subject)  # the parent's data key
        session = handle.session
        assert session is not None
        attrs = {"changed_inputs": ",".join(sorted(changed)), "first_affected": first}
        spent = inherited_state.total_usage if inherited_state is not None else None
        if spent is not None and spent.calls:  # the parent's spend at the fork, kept apart
            attrs[INHERITED_ATTRIBUTE] = spent.to_json()
        session.append(EventType.RUN_BRANCHED, confirm=True, parent_run_id=parent_run_id,
                       forked_from_seq=fork_seq, attributes=attrs)
        for stage_name in order[:cut]:
            ref = inherited.get(stage_name)
            if ref is None:
                continue
            store.verify(ref)
            rules = tuple(RuleResult(rr, True, f"inherited from {parent_run_id}")
                          for rr in spec.stage(stage_name).rules)
            session.append(EventType.VERIFIED, stage=stage_name, payload_ref=ref, artifact_refs=(ref,),
                           verification=rules, attributes={"inherited_from": parent_run_id})
        session.flush()
        completed = False
        blocked: str | None = None
        failure: Exception | None = None
        if execute:
            try:
                completed = r.execute(session, from_stage=start, stage_outputs=inherited).completed
            except ResumeBlocked as err:  # RUN_BLOCKED is on the branch's log
                blocked = err.reason
            except (DeliveryError, LeaseLost):
                raise  # the branch's log may not say what happened: nothing to report from it
            except Exception as err:  # noqa: BLE001 - a stage failed: FAILED is on the log, else re-raised
                failure = err
        else:
            session.close(release=True)
    finally:
        if own:
            r.close()
    plan = tuple(order[order.index(start):])
    if not execute:
        return BranchResult(handle.run_id, parent_run_id, fork_seq, first, tuple(inherited), plan, False,
                            executed=False)
    seen = _what_happened(settings, handle.run_id)
    if failure is not None and seen.failed is None:
        raise failure
    return BranchResult(handle.run_id, parent_run_id, fork_seq, first, tuple(inherited), plan, completed,
                        blocked, seen.ran, seen.blocked_stage if blocked is not None else None,
                        seen.failed if failure is not None else None,
                        seen.failed_stage if failure is not None else None)


@dataclass(frozen=True)
class _Seen:
    ran: tuple[str, ...]
    blocked_stage: str | None
    failed: str | None
    failed_stage: str | None


def _what_happened(settings: Settings, run_id: str) -> _Seen:
    """From the branch's log: the stages it verified itself (not inherited), the stage of its
    ``RUN_BLOCKED``, and its last ``FAILED`` (the error, the stage)."""
    from runlog.projections.log_reader import read_run

    ran: list[str] = []
    blocked: str | None = None
    failed: str | None = None
    failed_stage: str | None = None
    current: str | None = None
    for _, ev in read_run(settings, run_id):
        if ev.type is EventType.STAGE_STARTED:
            current = ev.stage
        elif ev.type is EventType.VERIFIED and "inherited_from" not in ev.attributes and ev.stage:
            ran.append(ev.stage)
        elif ev.type is EventType.RUN_BLOCKED:
            blocked = ev.stage or current
        elif ev.type is EventType.FAILED:
            failed_stage = ev.stage or current
            failed = f"{ev.error.kind}: {ev.error.message}" if ev.error is not None else "no error recorded"
    return _Seen(tuple(ran), blocked, failed, failed_stage)
