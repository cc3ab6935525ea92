"""``runlog upgrade``: move a run in flight to another version of its workflow (or to a fixed
definition of the same version), exact about what runs again.

A run is pinned to the workflow it started on. An upgrade is a person's decision on the log: the
operator takes the run's lease at a new epoch (``LEASE_ACQUIRED``, ``action=upgrade``) and appends
``RUN_UPGRADED`` (the new workflow, the checkpoint the run goes on from, who, why, from, to); then the
run continues in this process on the new code, as a resume does.

What runs again is decided from the stage fingerprints (:meth:`runlog.producers.Stage.fingerprint`) the run
recorded at its start (``RUN_STARTED`` attribute ``runlog.stages``) against the new version's: the
run goes on from its latest checkpoint whose completed stages are, in order, the first stages of the
new version with unchanged fingerprints. Every later stage runs on the new code. A run recorded
before fingerprints existed uses the fingerprints of its version as the App registers it, when the
App still registers that version with the same stages; otherwise every stage counts as changed (the
run starts over). Recorded calls of the stages that run again are not compared with the new code's
(they are ``SUPERSEDED``); effects go through the effects ledger, so an effect done under the old
version is never executed again (its external id is handed back), and an effect in doubt refuses
the upgrade (``runlog resolve`` it first).

:func:`plan_upgrade` decides (pure; ``--dry-run`` prints it), :func:`upgrade_run` acts and reports the
same plan with what happened.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runlog.processors.operate import OperatorRefused
from runlog.producers import App, Workflow
from runlog.projections import RunState, RunStatus
from runlog.schemas import ArtifactRef, Checkpoint, EventType, ReplayPolicy
from runlog.schemas.errors import WorkflowDefinitionError
from runlog.schemas.internal import STAGES_ATTRIBUTE

if TYPE_CHECKING:
    from runlog.processors.resume.resumer import ResumeOutcome
    from runlog.producers.internal import LedgerEntry
    from runlog.schemas.settings import Settings

__all__ = ["UpgradePlan", "UpgradeResult", "plan_upgrade", "upgrade_run", "upgrade_runs"]

_OPEN = (RunStatus.RUNNING, RunStatus.WAITING, RunStatus.BLOCKED, RunStatus.FAILED, RunStatus.PENDING)


@dataclasses.dataclass(frozen=True)
class UpgradePlan:
    """What an upgrade does (the same for ``--dry-run`` and the real one)."""

    run_id: str
    workflow: str
    from_version: str
    to_version: str
    status: str
    """The run's status before the upgrade."""
    checkpoint_id: str | None
    """The checkpoint the run goes on from (None: from the new version's first stage)."""
    checkpoint_seq: int
    kept_stages: tuple[str, ...]
    """Completed stages kept as they are (their outputs are the checkpoint's)."""
    rerun_stages: tuple[str, ...]
    """The new version's stages that run, in order (again, or for the first time)."""
    changed_stages: tuple[str, ...]
    """Stages whose definition differs between the two (added, removed or changed)."""
    fingerprints: str
    """Where the run's stage fingerprints came from: ``recorded``, ``registered`` (the App's
    definition of the run's version) or ``none`` (every stage counts as changed)."""
    effects: tuple[str, ...]
    """What happens to the effects of the stages that run again."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> list[str]:
        where = (f"from checkpoint {self.checkpoint_id} (kept: {', '.join(self.kept_stages)})"
                 if self.checkpoint_id else "from the first stage (no checkpoint is kept)")
        lines = [f"upgrade {self.run_id} ({self.status}): {self.workflow}@{self.from_version} -> "
                 f"{self.workflow}@{self.to_version}",
                 f"changed stages: {', '.join(self.changed_stages) or 'none'} "
                 f"(fingerprints: {self.fingerprints})",
                 f"continues {where}",
                 f"runs on the new code: {', '.join(self.rerun_stages) or 'nothing'}"]
        lines += [f"effect: {e}" for e in self.effects]
        return lines


@dataclasses.dataclass(frozen=True)
class UpgradeResult:
    """An upgrade's plan and, unless it was a dry run, how the run went on."""

    plan: UpgradePlan
    outcome: ResumeOutcome | None = None
    executed_stages: tuple[str, ...] = ()
    """The stages started after ``RUN_UPGRADED`` (read back from the log)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"plan": self.plan.to_dict(), "executed_stages": list(self.executed_stages)}
        if self.outcome is not None:
            out.update(result=self.outcome.result, detail=self.outcome.detail, epoch=self.outcome.epoch)
        return out


def _old_fingerprints(state: RunState, app: App) -> tuple[dict[str, str], str]:
    if state.stage_fingerprints:
        return dict(state.stage_fingerprints), "recorded"
    wf = state.workflow
    assert wf is not None
    if app.registry.serves(wf.name, wf.version):
        registered = app.registry.get(wf.name, wf.version)
        if registered.spec() == wf:
            return registered.fingerprints(), "registered"
    return {}, "none"


def plan_upgrade(state: RunState, app: App, to_version: str,
                 history: Sequence[tuple[Checkpoint, RunState]],
                 intact: Callable[[Iterable[ArtifactRef]], str | None],
                 ledger: Mapping[str, LedgerEntry] | None = None) -> UpgradePlan:
    """Decide the upgrade of the run ``state`` to ``to_version`` of its workflow in ``app``.

    ``history``: the run's checkpoints with the state as of each, oldest first; ``intact(refs)``: None
    when the artifacts are all intact, else the problem; ``ledger``: the effects ledger's entries for
    the delivery keys of the run's open effects (a ``NEVER`` effect the ledger records done happened:
    the writer died after the call returned, before the log had its result; the ledger hands its id
    back to the new code, so it is not in doubt).

    Raises:
        OperatorRefused: the run is settled (completed, cancelled) or has no workflow; ``app`` does
            not register ``to_version``; nothing would change; an effect of a stage that would run
            again is in doubt (``runlog resolve`` it first).
    """
    wf = state.workflow
    if wf is None:
        raise OperatorRefused(f"run {state.run_id} has no accepted RUN_STARTED: nothing to upgrade")
    if state.status not in _OPEN:
        raise OperatorRefused(f"run {state.run_id} is {state.status.value}: only an open run is upgraded")
    try:
        new: Workflow = app.registry.get(wf.name, to_version)
    except WorkflowDefinitionError as err:
        raise OperatorRefused(f"upgrade of {state.run_id} refused: {err}") from err
    old_fps, source = _old_fingerprints(state, app)
    new_fps = new.fingerprints()
    new_names = new.spec().stage_names
    old_names = wf.stage_names
    changed = tuple(n for n in dict.fromkeys([*old_names, *new_names])
                    if n not in old_fps or old_fps.get(n) != new_fps.get(n))
    if new.spec() == wf and not changed:
        raise OperatorRefused(f"run {state.run_id} is already on {wf.name}@{to_version} with this "
                              "definition: nothing to upgrade (runlog resume or runlog retry continues it)")
    prefix: list[str] = []
    for i, name in enumerate(new_names):
        if i >= len(old_names) or old_names[i] != name or name in changed:
            break
        prefix.append(name)
    chosen: tuple[Checkpoint, RunState] | None = None
    for cp, snap in reversed(history):
        done = tuple(snap.completed_stages)
        if done == tuple(prefix[:len(done)]) and done and intact(cp.artifacts) is None:
            chosen = (cp, snap)
            break
    kept = tuple(chosen[1].completed_stages) if chosen is not None else ()
    rerun = tuple(n for n in new_names if n not in kept)
    effects: list[str] = []
    known = ledger or {}
    settled = {k for k, entry in known.items() if entry.done}
    doubt = [e for e in state.open_effects.values()
             if e.stage not in kept and e.replay_policy in (None, ReplayPolicy.NEVER)
             and e.delivery_key not in settled]
    if doubt:
        keys = ", ".join(f"{e.tool or '?'} {e.delivery_key[:16]}..." for e in doubt)
        raise OperatorRefused(f"run {state.run_id} has effects in doubt in stages that would run again "
                              f"({keys}): decide them first (runlog resolve), then upgrade")
    for e in sorted(state.closed_effects.values(), key=lambda x: x.seq):
        if e.stage in kept or not e.external_id:
            continue
        effects.append(f"{e.tool or '?'} in {e.stage} happened under {wf.version} (external id "
                       f"{e.external_id}): not executed again, the effects ledger hands its id back")
    for e in state.open_effects.values():
        if e.stage not in kept and e.delivery_key in settled:
            effects.append(f"{e.tool or '?'} in {e.stage} happened (the effects ledger records external id "
                           f"{known[e.delivery_key].external_id}): not executed again, the ledger hands "
                           "its id back")
        elif e.stage not in kept:
            policy = e.replay_policy.value if e.replay_policy else "?"
            effects.append(f"{e.tool or '?'} in {e.stage} is open ({policy}): handled by its policy on the "
                           "new code")
    kept_cp = chosen[0] if chosen is not None else None
    return UpgradePlan(state.run_id, wf.name, wf.version, to_version, state.status.value,
                       kept_cp.checkpoint_id if kept_cp else None, kept_cp.last_seq if kept_cp else 0, kept,
                       rerun, changed,
                       source, tuple(effects))


def upgrade_attributes(plan: UpgradePlan, new: Workflow, snap: RunState | None, *, by: str,
                       reason: str) -> dict[str, str]:
    """``RUN_UPGRADED``'s attributes for ``plan`` (``snap``: the state as of its checkpoint)."""
    outputs = {} if snap is None else {
        k: {"uri": r.uri, "sha256": r.sha256, "size": r.size, "media_type": r.media_type}
        for k, r in snap.stage_outputs.items() if k in plan.kept_stages}
    return {"operator": by, "reason": reason, "from": plan.from_version, "to": plan.to_version,
            "checkpoint": plan.checkpoint_id or "", "checkpoint_seq": str(plan.checkpoint_seq),
            "completed": json.dumps(list(plan.kept_stages)), "outputs": json.dumps(outputs, sort_keys=True),
            "rerun": json.dumps(list(plan.rerun_stages)),
            STAGES_ATTRIBUTE: json.dumps(new.fingerprints(), sort_keys=True, separators=(",", ":"))}


def upgrade_run(settings: Settings, app: App, run_id: str, to_version: str, *, by: str, reason: str,
                dry_run: bool = False) -> UpgradeResult:
    """Upgrade one run (see the module docstring); ``dry_run``: decide only.

    Raises:
        OperatorRefused: see :func:`plan_upgrade`; also an empty ``by`` or ``reason``, an unknown run,
            and a run whose writer still holds its lease (it is running: upgrade it once it let go,
            or cancel it).
    """
    from runlog.processors.operate import _who
    from runlog.processors.resume import Resumer, UnknownRun

    who = _who(by)
    if not reason.strip():
        raise OperatorRefused("say why: --reason is required (recorded on the log)")
    with Resumer(settings, app) as r:
        try:
            state, _ = r.load(run_id)
        except UnknownRun as err:
            raise OperatorRefused(str(err)) from err
        history = r.reader.checkpoint_history(state) if state.checkpoints else []
        ledger = r.reader.ledger_entries(state)
        plan = plan_upgrade(state, app, to_version, history, r.reader.intact_problem, ledger)
        if dry_run:  # refuses what the upgrade itself would refuse: a run a live writer holds
            from runlog.processors.operate import writer_lease_ms

            held = writer_lease_ms(settings, run_id)
            if held > 0:
                raise OperatorRefused(f"run {run_id} is held by a live writer (its lease has {held} ms "
                                      "left): upgrade it once that writer let go of it, or cancel it")
            return UpgradeResult(plan)
        new = app.registry.get(plan.workflow, to_version)
        snap = next((s for c, s in history if c.checkpoint_id == plan.checkpoint_id), None)
        attrs = upgrade_attributes(plan, new, snap, by=who, reason=reason)
        refs = tuple(snap.verified_artifacts) if snap is not None else ()
        outcome = r.upgrade(state, new, attrs, stage=plan.kept_stages[-1] if plan.kept_stages else None,
                            artifact_refs=refs, operator={"operator": who, "action": "upgrade",
                                                          "reason": reason})
        if outcome.result == "contended":  # nothing appended: a writer holds the run
            raise OperatorRefused(f"run {run_id} is held by a live writer ({outcome.detail}): upgrade it "
                                  "once that writer let go of it, or cancel it")
        executed = _started_after_upgrade(r, run_id)
    return UpgradeResult(plan, outcome, executed)


def _started_after_upgrade(r: Any, run_id: str) -> tuple[str, ...]:
    state, _ = r.load(run_id)
    out: list[str] = []
    seen = False
    for _, ev, _ in r.events.run_records(run_id, state.partition, 0):
        if ev.type is EventType.RUN_UPGRADED:
            seen, out = True, []
        elif seen and ev.type is EventType.STAGE_STARTED and ev.stage and ev.stage not in out:
            out.append(ev.stage)
    return tuple(out)


def upgrade_runs(settings: Settings, app: App, workflow: str, from_version: str, to_version: str, *,
                 by: str, reason: str, dry_run: bool = False) -> list[tuple[str, UpgradeResult | str]]:
    """Upgrade every open run of ``workflow@from_version`` (from the projection): per run its result or
    why it was refused."""
    from runlog.projections import RedisStore

    store = RedisStore.from_settings(settings)
    try:
        ids = [run_id for status in _OPEN for run_id in store.runs(status)]
        states = store.load_states(ids) if ids else {}
    finally:
        store.client.close()
    out: list[tuple[str, UpgradeResult | str]] = []
    for run_id in sorted(ids):
        st = states.get(run_id)
        if st is None or st.workflow is None or st.workflow.name != workflow \
                or st.workflow.version != from_version:
            continue
        try:
            out.append((run_id, upgrade_run(settings, app, run_id, to_version, by=by, reason=reason,
                                            dry_run=dry_run)))
        except OperatorRefused as err:
            out.append((run_id, str(err)))
    return out
