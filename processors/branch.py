"""Explicit upgrade: branch a run with new input versions instead of changing them silently.

The branch is a new run (``parent_run_id``, ``forked_from_seq``) forked at the last
checkpoint before the first stage that reads a changed input. Its log starts with
``RUN_STARTED`` (the new pinned versions), ``RUN_BRANCHED``, and one ``VERIFIED``
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

from processors.inspect import run_history
from processors.resume import App
from producers import ArtifactStore, LocalArtifactStore, Runner
from schemas import ArtifactRef, ConfigError, EventType, ResumeBlocked, RuleResult, Settings

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
    store = artifacts or LocalArtifactStore(settings.artifact_root)
    params: dict[str, Any] = {}
    if state.params_ref is not None:
        params = dict(json.loads(store.get(state.params_ref)))
    own = runner is None
    r = runner or Runner.from_settings(settings, source=app.source, store=store)
    try:
        pinned = {**state.input_versions, **changes}
        handle = r.start_run(workflow, params, pinned, parent_run_id=parent_run_id,
                             forked_from_seq=fork_seq)
        session = handle.session
        assert session is not None
        session.append(EventType.RUN_BRANCHED, confirm=True, parent_run_id=parent_run_id,
                       forked_from_seq=fork_seq,
                       attributes={"changed_inputs": ",".join(sorted(changed)), "first_affected": first})
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
        if execute:
            try:
                completed = r.execute(session, from_stage=start, stage_outputs=inherited).completed
            except ResumeBlocked as err:  # RUN_BLOCKED is on the branch's log
                blocked = err.reason
        else:
            session.close(release=True)
    finally:
        if own:
            r.close()
    ran, blocked_stage = _what_ran(settings, handle.run_id) if execute else ((), None)
    return BranchResult(handle.run_id, parent_run_id, fork_seq, first, tuple(inherited),
                        tuple(order[order.index(start):]), completed, blocked, ran,
                        blocked_stage if blocked is not None else None)


def _what_ran(settings: Settings, run_id: str) -> tuple[tuple[str, ...], str | None]:
    """The stages the branch verified itself (not inherited), and the stage of its ``RUN_BLOCKED``."""
    from projections.log_reader import read_run

    ran: list[str] = []
    blocked: str | None = None
    current: str | None = None
    for _, ev in read_run(settings, run_id):
        if ev.type is EventType.STAGE_STARTED:
            current = ev.stage
        elif ev.type is EventType.VERIFIED and "inherited_from" not in ev.attributes and ev.stage:
            ran.append(ev.stage)
        elif ev.type is EventType.RUN_BLOCKED:
            blocked = ev.stage or current
    return tuple(ran), blocked
