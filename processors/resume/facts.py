"""What resume reads before it decides: a run's facts, through the resumer's ports.

:class:`FactsReader` reads a run through the event log
(:class:`~runlog.processors.resume.ports.RunEventReader`),
the projection store, the artifact store and the effects ledger, into the
:class:`~runlog.processors.resume.plan.PlanFacts` that :func:`~runlog.processors.resume.plan.decide_plan`
decides from. It reads only what the plan can use: the latest projected checkpoint and the tail
after it in the usual case; the whole checkpoint history only when the latest fails verification;
nothing past a refusal. It changes nothing.
"""

from __future__ import annotations

from collections.abc import Iterable

from runlog.processors.resume.plan import (
    CheckpointCheck,
    PlanFacts,
    calls_to_guard,
    chosen_checkpoint,
    fell_back,
    needs_checkpoints,
    strict_refusal,
)
from runlog.processors.resume.ports import RunEventReader
from runlog.producers import App, ArtifactStore
from runlog.producers.internal import EffectLedger, LedgerEntry
from runlog.projections import CallRecord, CallStatus, RunState
from runlog.projections.fold import fold
from runlog.projections.store import ProjectionStore
from runlog.schemas import ArtifactError, ArtifactRef, Checkpoint, EventType, RunlogError

__all__ = ["FactsReader", "UnknownRun"]


class UnknownRun(RunlogError):
    """Neither Redis nor the log knows this run."""

    def __init__(self, run_id: str) -> None:
        self.run_id = run_id
        super().__init__(f"no run {run_id!r} in Redis or on the events topic")


class FactsReader:
    """Reads a run's :class:`~runlog.processors.resume.plan.PlanFacts` through the ports.

    Args:
        app: the application (whether it may continue the run decides what else is read).
        projection: state snapshots and checkpoints.
        events: the run's events on the log.
        artifacts: where checkpoint artifacts and recorded results are verified.
        ledger: the effects ledger open effect intents are looked up in (None: none).
    """

    def __init__(self, app: App, projection: ProjectionStore, events: RunEventReader,
                 artifacts: ArtifactStore, ledger: EffectLedger | None) -> None:
        self.app = app
        self.projection = projection
        self.events = events
        self.artifacts = artifacts
        self.ledger = ledger

    # -- 1 and 2: load the run, fold the tail ------------------------------------------------

    def partition_of(self, run_id: str) -> int:
        return self.events.partition_of(run_id)

    def tail(self, run_id: str, partition: int, from_offset: int,
              snapshot: RunState | None) -> tuple[RunState | None, int]:
        """Fold the run's events from ``from_offset`` on ``partition`` onto ``snapshot``."""
        state, n = snapshot, 0
        for offset, ev, h in self.events.run_records(run_id, partition, from_offset):
            state, _ = fold(state, ev, (partition, offset), content_hash=h)
            n += 1
        return state, n

    def load(self, run_id: str) -> tuple[RunState, int]:
        """The run's current state from the nearest snapshot plus the tail of the log."""
        stored = self.projection.checkpoints(run_id, last=1)
        snapshot = stored[-1].state if stored else self.projection.load_state(run_id)
        if snapshot is not None and snapshot.partition >= 0:
            state, n = self.tail(run_id, snapshot.partition, snapshot.offset + 1, snapshot)
        else:
            state, n = self.tail(run_id, self.partition_of(run_id), 0, None)
        if state is None:
            raise UnknownRun(run_id)
        return state, n

    def checkpoint_history(self, state: RunState) -> list[tuple[Checkpoint, RunState]]:
        """Every checkpoint of the run with the state as of it, oldest first (an upgrade chooses)."""
        return self._checkpoint_history(state)

    def intact_problem(self, refs: Iterable[ArtifactRef]) -> str | None:
        """None when every artifact of ``refs`` is intact, else the problems found."""
        return self._intact(refs)[1]

    def _checkpoint_history(self, state: RunState) -> list[tuple[Checkpoint, RunState]]:
        """Every checkpoint of the run with the state as of it, oldest first."""
        stored = self.projection.checkpoints(state.run_id)
        history = [(sc.checkpoint, sc.state) for sc in stored]
        known = {c.checkpoint_id for c, _ in history}
        if all(e.checkpoint_id in known for e in state.checkpoints):
            if state.checkpoint is not None and state.checkpoint.checkpoint_id not in known:
                history.append((state.checkpoint, state))
            return history
        # Redis lost some snapshots: fold the run from the start and keep each checkpoint's state.
        return self._history_from_log(state)

    def _history_from_log(self, state: RunState) -> list[tuple[Checkpoint, RunState]]:
        out: list[tuple[Checkpoint, RunState]] = []
        cur: RunState | None = None
        for offset, ev, h in self.events.run_records(state.run_id, state.partition, 0):
            cur, outcome = fold(cur, ev, (state.partition, offset), content_hash=h)
            if outcome.checkpoint is not None:
                out.append((outcome.checkpoint, cur))
        return out

    def _results_after(self, cp: Checkpoint, snap: RunState) -> tuple[dict[str, CallRecord], int]:
        """Calls completed (``TOOL_RESULT`` accepted) after checkpoint ``cp``, read from the log.

        Used when resume falls back to an earlier checkpoint: the fold forgets the calls
        of a stage once it is verified, but their recorded results are still facts.
        """
        out: dict[str, CallRecord] = {}
        hashes: dict[str, str | None] = {}
        n = 0
        if cp.partition < 0:
            return out, n
        cur = snap
        for offset, ev, h in self.events.run_records(cp.run_id, cp.partition, cp.offset + 1):
            n += 1
            cur, outcome = fold(cur, ev, (cp.partition, offset), content_hash=h)
            if outcome.accepted and ev.type is EventType.TOOL_CALLED and ev.call_id:
                hashes[ev.call_id] = ev.request_hash
            if outcome.accepted and ev.type is EventType.TOOL_RESULT and ev.call_id \
                    and ev.payload_ref is not None:
                out[ev.call_id] = CallRecord(call_id=ev.call_id, tool=ev.tool, policy=ev.replay_policy,
                                             status=CallStatus.RESULT, stage=ev.stage, seq=ev.seq,
                                             result=ev.payload_ref, request_hash=hashes.get(ev.call_id))
        return out, n

    # -- 3 to 6: what the plan decides from ------------------------------------------------

    def _intact(self, refs: Iterable[ArtifactRef]) -> tuple[int, str | None]:
        """How many artifacts were checked, and every problem found (None: all intact)."""
        n, problems = 0, []
        for ref in refs:
            n += 1
            try:
                self.artifacts.verify(ref)
            except ArtifactError as err:
                problems.append(f"{type(err).__name__}: {err}")
        return n, "; ".join(problems) if problems else None

    def _check_checkpoints(self, state: RunState) -> tuple[tuple[CheckpointCheck, ...], int]:
        """The checkpoints verified, newest first up to the first intact one, and how many the run
        has. The usual case reads one: the latest, projected; the whole history is read only when
        it fails verification, so a plan's cost does not grow with the checkpoint count."""
        newest = self.projection.checkpoints(state.run_id, last=1) if state.checkpoint else []
        if newest and state.checkpoint is not None \
                and newest[-1].checkpoint.checkpoint_id == state.checkpoint.checkpoint_id:
            history = [(newest[-1].checkpoint, newest[-1].state)]
        else:
            history = self._checkpoint_history(state) if state.checkpoints else []
        only_latest = len(newest) == 1 and len(history) == 1
        checks: list[CheckpointCheck] = []
        tried: set[str] = set()
        while True:
            for cp, snap in reversed(history):
                if cp.checkpoint_id in tried:
                    continue
                tried.add(cp.checkpoint_id)
                checked, problem = self._intact(cp.artifacts)
                checks.append(CheckpointCheck(cp, snap, checked, problem))
                if problem is None:
                    break
            if (checks and checks[-1].problem is None) or not only_latest:
                return tuple(checks), len(history)
            only_latest = False
            history = self._checkpoint_history(state)  # fall back beyond the latest

    def facts(self, run_id: str) -> PlanFacts:
        """Read everything the plan decides from, through the ports (changes nothing)."""
        state, n = self.load(run_id)
        if not needs_checkpoints(state):
            return PlanFacts(state, n)
        assert state.workflow is not None
        checks, known = self._check_checkpoints(state)
        chosen = chosen_checkpoint(checks)
        facts = PlanFacts(state, n, checks, known)
        if (chosen is None and known) or strict_refusal(state.workflow, self.app) is not None:
            return facts  # blocked: nothing more to read
        after: dict[str, CallRecord] = {}
        read = 0
        if chosen is not None and fell_back(checks):
            after, read = self._results_after(chosen.checkpoint, chosen.state)
        problems: dict[str, str] = {}
        for call in calls_to_guard(state, chosen, after).values():
            if call.status is CallStatus.RESULT and call.result is not None:
                _, problem = self._intact([call.result])
                if problem is not None:
                    problems[call.call_id] = problem
        return PlanFacts(state, n, checks, known, after, read, problems, self.ledger_entries(state))

    def ledger_entries(self, state: RunState) -> dict[str, LedgerEntry]:
        """The effects ledger's entries for the delivery keys of ``state``'s open effects."""
        ledger: dict[str, LedgerEntry] = {}
        if self.ledger is not None:
            for eff in state.open_effects.values():
                entry = self.ledger.lookup(eff.delivery_key)
                if entry is not None:
                    ledger[eff.delivery_key] = entry
        return ledger

