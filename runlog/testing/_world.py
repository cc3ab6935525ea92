"""An in-memory world: the runner, the resumer and the projector on in-memory adapters, one process.

A crash is simulated, not real: at the armed point the writer's SIGKILL
(:func:`runlog.producers.crash.kill_self`) is replaced by raising :class:`SimulatedCrash`, and from
that moment the event log drops every append of the crashed worker, as a dead process would send
nothing. The crashed worker's lease is then expired (its ttl running out) and the run is resumed by
the same :class:`~runlog.processors.resume.Resumer` that ``runlog resumer`` runs, reading the log
and the projection a projector would have written (:class:`~runlog.projections.batch.BatchProjector`).
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, TypeVar

from runlog.processors.resume import App, ResumeOutcome, Resumer
from runlog.processors.resume.ports import MemoryRunEvents
from runlog.producers import ArtifactStore, CallInfo, DictInputSource, Runner, RunResult, Tool, Workflow
from runlog.producers import crash as _crash
from runlog.producers.internal import (
    EXECUTE,
    InMemoryArtifactStore,
    InMemoryEffectLedger,
    InMemoryEventLog,
    InMemoryLeaseManager,
    InMemoryLeaseTable,
    InMemoryLimiter,
    InMemoryRunKeys,
    register,
    sealing,
    unregister,
)
from runlog.projections import MemoryStore, RunState
from runlog.projections.batch import BatchProjector
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, RunEvent, Settings

__all__ = ["CrashPointNotReached", "CrashResult", "InMemoryWorld", "SimulatedCrash"]

T = TypeVar("T")

_one_crash_at_a_time = threading.Lock()
"""The armed point is one per process: two simulated crashes must not overlap."""


class SimulatedCrash(BaseException):
    """The worker process died at a crash point (raised in place of SIGKILL).

    A ``BaseException``, like ``KeyboardInterrupt``: a stage's ``except Exception`` does not catch it,
    so nothing records it as a stage failure.

    Attributes:
        point: the point reached, subject included (``before:EFFECT_RESULT:deliver/send/0``).
    """

    def __init__(self, point: str) -> None:
        super().__init__(point)
        self.point = point


class CrashPointNotReached(AssertionError):
    """The run never reached the armed crash point: a crash test that did not crash proves nothing.

    Attributes:
        point: the point that was armed.
        run_id: the run, which went on without crashing.
    """

    def __init__(self, point: str, run_id: str) -> None:
        super().__init__(f"run {run_id} never reached the crash point {point!r}")
        self.point = point
        self.run_id = run_id


@dataclass(frozen=True)
class CrashResult:
    """What :meth:`InMemoryWorld.crash_and_resume` saw: the crash, the resume and every tool execution."""

    run_id: str
    crashed_at: str
    """The crash point reached, subject included (``before:EFFECT_RESULT:deliver/send/0``)."""
    outcome: ResumeOutcome
    """The resume's outcome (``outcome.result``: ``completed``, ``blocked``, ``failed``, ...;
    ``outcome.plan``: the checkpoint, the reused calls and the open effects it settled)."""
    executions: Mapping[str, int]
    """Tool name -> how many times its function was entered, before and after the crash (a retry's
    attempts count one each). A tool whose recorded result was reused, or whose effect was
    reconciled, was not entered again."""
    executed_calls: tuple[str, ...]
    """The call ids whose tool function was entered, in order (``deliver/send/0``), once per entry."""
    events_at_crash: tuple[RunEvent, ...]
    """The run's log as the crash left it."""
    events: tuple[RunEvent, ...]
    """The run's whole log after the resume."""
    state: RunState = field(repr=False)
    """The run's state folded from :attr:`events` (``state.status``, ``state.completed_stages``, ...)."""

    @property
    def completed(self) -> bool:
        """The resume completed the run (``RUN_COMPLETED`` is its last event)."""
        return self.outcome.result == "completed" and bool(self.events) and \
            self.events[-1].type is EventType.RUN_COMPLETED

    def types(self) -> list[EventType]:
        """The types of the run's events, in log order."""
        return [e.type for e in self.events]


class InMemoryWorld:
    """Runlog's services in memory: start, crash and resume runs of your workflows in one test.

    Every part is the in-memory twin of a real one and passes the same contract tests: the events
    topic (:attr:`log`), the lease table in Redis (:attr:`leases`), the artifact store
    (:attr:`artifacts`), the effects ledger (:attr:`ledger`), the rate limits (:attr:`limiter`) and
    the projection (:attr:`store`).
    Nothing opens a socket.

    Args:
        app: the application a resumer would load (``runlog resumer --app module:app``): its
            workflows, the tools whose replay policies and reconcile functions settle open effects,
            and its input source. When None, each call builds one from the workflow and ``tools``
            it is given.
        settings: topic names and partition count of the in-memory log (tracing off by default).
    """

    def __init__(self, app: App | None = None, *, settings: Settings | None = None) -> None:
        self.app = app
        self.settings = settings or Settings(tracing=False)
        self.log = InMemoryEventLog(self.settings, writer_id="worker-1")
        self.leases = InMemoryLeaseTable()
        # sealed when settings.encryption (the keyring: settings.keyring)
        self.artifacts: ArtifactStore = sealing(
            InMemoryArtifactStore(inline_max=self.settings.artifact_inline_bytes), self.settings)
        self.ledger = InMemoryEffectLedger()
        self.limiter = InMemoryLimiter()
        """The rate limits the world's runners count against (:attr:`runlog.producers.Tool.limit`)."""
        self.store = MemoryStore()
        self._projector = BatchProjector(self.store, self.log.codec)
        self._projected: dict[str, int] = {}  # run id -> how many of its records the store has seen
        self._lock = threading.Lock()
        self._executed: list[tuple[str, str, str]] = []  # (run id, tool, call id), in order
        self._workflows: dict[tuple[str, str], Workflow] = {}  # what the runs here ran, for their resume
        self.run_keys = InMemoryRunKeys()
        """The run keys (Redis): keyed starts, child runs (``ctx.start_child``) among them."""
        self._served = 0  # resume requests of the log handled by serve()

    # -- the parts

    def runner(self, holder: str = "worker-1") -> Runner:
        """A :class:`~runlog.producers.Runner` on this world's log, leases, artifacts and ledger; each
        ``holder`` plays one worker process."""
        source = self.app.source if self.app is not None else DictInputSource({})
        return Runner(self.log, InMemoryLeaseManager(self.leases, holder=holder), self.artifacts,
                      source=source, ledger=self.ledger, run_log=self.log, run_keys=self.run_keys,
                      prices=self.app.prices if self.app is not None else None, limiter=self.limiter)

    def events(self, run_id: str) -> list[RunEvent]:
        """The run's events, in log order."""
        return self.log.events(run_id)

    def state(self, run_id: str) -> RunState | None:
        """The run's state folded from its events (None: no such run)."""
        return fold_all(self.log.events(run_id))

    def executions(self, run_id: str | None = None) -> Counter[str]:
        """Tool name -> how many times its function was entered (in ``run_id``, or in every run)."""
        with self._lock:
            return Counter(tool for run, tool, _ in self._executed if run_id in (None, run))

    def project(self) -> None:
        """Fold the events the projection has not seen into :attr:`store`, as the projector does."""
        for run_id in self.log.run_ids():
            records = self.log.records(run_id)
            seen = self._projected.get(run_id, 0)
            if len(records) > seen:
                self._projector.process_events([(r.event, (r.partition, r.offset), r.hash)
                                                for r in records[seen:]])
                self._projected[run_id] = len(records)

    # -- runs

    def run(self, workflow: Workflow, params: Mapping[str, Any], *,
            inputs: Mapping[str, str] | None = None) -> RunResult:
        """Start a run and execute it to its end, without a crash."""
        self._workflows[(workflow.name, workflow.version)] = workflow
        runner = self.runner()
        handle = runner.start_run(workflow, params, inputs)
        session = handle.session
        assert session is not None  # a run without a key is always new
        return self._counted(handle.run_id, lambda: runner.execute(session))

    def crash(self, workflow: Workflow, params: Mapping[str, Any], *, at: str,
              inputs: Mapping[str, str] | None = None) -> tuple[str, str]:
        """Run ``workflow`` until the crash point ``at`` and kill its worker there.

        ``at`` is a point of :mod:`runlog.producers.crash` (``before:EFFECT_RESULT:deliver/send/0``);
        without its subject (``before:EFFECT_RESULT``) the first such point of the run is taken.
        Afterwards the log ends where the point says and the dead worker's lease has expired.

        Returns:
            The run id and the point reached, subject included.

        Raises:
            CrashPointNotReached: the run went on to its end without reaching ``at``.
        """
        self._workflows[(workflow.name, workflow.version)] = workflow
        reached: list[str] = []
        silenced: list[str] = []

        def die(point: str) -> NoReturn:
            _crash.arm(None)  # one crash: the resume goes through the same point
            reached.append(point)
            for run in self.log.run_ids():
                self.log.fail_run(run, "the worker process is dead")  # it sends nothing more
                silenced.append(run)
            raise SimulatedCrash(point)

        runner = self.runner()
        run_id = ""
        before = set(self.log.run_ids())
        with _one_crash_at_a_time:
            _crash.on_crash(die)
            _crash.arm(at)
            try:
                handle = runner.start_run(workflow, params, inputs)
                run_id = handle.run_id
                assert handle.session is not None  # a run without a key is always new
                session = handle.session
                self._counted(run_id, lambda: runner.execute(session))
            except BaseException:
                if not reached:
                    raise  # the run failed on its own before the point
                # the worker is dead: what its unwinding raised (SimulatedCrash, or an append of a
                # finally block refused) is no one's to see
            finally:
                _crash.arm(None)
                _crash.on_crash(None)
                for run in silenced:
                    self.log.heal_run(run)
        if not reached:
            raise CrashPointNotReached(at, run_id)
        if not run_id:  # the start crashed: the run is the one it began on the log, if any
            run_id = next((r for r in self.log.run_ids() if r not in before), "")
        self.leases.expire(run_id)  # the dead worker's lease runs out
        return run_id, reached[0]

    def resume(self, run_id: str, *, tools: Iterable[Tool] = ()) -> ResumeOutcome:
        """Resume a run as ``runlog resumer`` does: project its events, take its lease at a new epoch,
        settle open effects by their tools' replay policies, continue from its last checkpoint.
        ``tools``: used when the world has no App (with the run's workflow, which must be
        registered through the App or have been run in this world)."""
        app = self._app_for(run_id, tools)
        self.project()
        with Resumer(self.settings, app, runner=self.runner("resumer-1"), artifacts=self.artifacts,
                     projection=self.store, events=MemoryRunEvents(self.log)) as resumer:
            outcome = self._counted(run_id, lambda: resumer.resume(run_id))
        self.project()
        return outcome

    def serve(self, *, tools: Iterable[Tool] = (), limit: int = 10_000) -> list[ResumeOutcome]:
        """Handle every resume request on the log not handled yet, and those they lead to, as the App's
        ``runlog resumer`` group would (one request after another, in the order they were made): the
        child runs a stage started (``ctx.start_child``), and the parents their ends wake. Returns the
        outcomes, in order.

        Raises:
            RuntimeError: more than ``limit`` requests (runs that keep asking for each other).
        """
        outcomes: list[ResumeOutcome] = []
        while self._served < len(self.log.resume_requests):
            if len(outcomes) >= limit:
                raise RuntimeError(f"serve(): more than {limit} resume requests")
            request = self.log.resume_requests[self._served]
            self._served += 1
            outcomes.append(self.resume(request.run_id, tools=tools))
        return outcomes

    def crash_and_resume(self, workflow: Workflow, params: Mapping[str, Any], *, at: str,
                         tools: Iterable[Tool] = (), inputs: Mapping[str, str] | None = None) -> CrashResult:
        """Run ``workflow`` until the crash point ``at``, kill its worker there, resume the run.

        Args:
            workflow: the workflow to run.
            params: the run's parameters.
            at: a crash point (:meth:`crash`), e.g. ``before:EFFECT_RESULT``.
            tools: the workflow's tools, when the world was made without an App.
            inputs: pinned input versions, as for :meth:`~runlog.producers.Runner.start_run`.

        Returns:
            What a test asserts on: the outcome, the tool executions, the events.

        Raises:
            CrashPointNotReached: the run never reached ``at``.
        """
        run_id, point = self.crash(workflow, params, at=at, inputs=inputs)
        at_crash = tuple(self.log.events(run_id))
        outcome = self.resume(run_id, tools=tools)
        events = tuple(self.log.events(run_id))
        state = fold_all(events)
        assert state is not None
        with self._lock:
            calls = tuple(call for run, _, call in self._executed if run == run_id)
        return CrashResult(run_id, point, outcome, dict(self.executions(run_id)), calls, at_crash, events,
                           state)

    # -- helpers

    def _app_for(self, run_id: str, tools: Iterable[Tool]) -> App:
        if self.app is not None:
            return self.app
        state = self.state(run_id)
        spec = state.workflow if state is not None else None
        known: Sequence[Workflow] = [w for key, w in self._workflows.items()
                                     if spec is None or key == (spec.name, spec.version)]
        return App.of(known, tools, DictInputSource({}))

    def _counted(self, run_id: str, body: Callable[[], T]) -> T:
        """Call ``body()`` counting the tool functions ``run_id`` enters (the replay hook's interceptor:
        consulted right before a tool function is entered, never for a reused result)."""

        def count(tool: Tool, call: CallInfo, args: Mapping[str, Any]) -> Any:
            with self._lock:
                self._executed.append((run_id, tool.name, call.call_id))
            return EXECUTE

        register(run_id, count)
        try:
            return body()
        finally:
            unregister(run_id)
