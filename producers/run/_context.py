"""The run context a stage function receives: inputs, earlier outputs, and tool calls, as
:class:`StageContext` (called) and :class:`AsyncStageContext` (awaited); both drive the same steps
(:mod:`runlog.producers.calls._call_steps`)."""

from __future__ import annotations

import asyncio
import datetime as _dt
import math
from collections.abc import Coroutine, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

from runlog.producers.base._protocol import INLINE, Mode, Steps, adrive, drive
from runlog.producers.calls._call_steps import _ContextCore
from runlog.producers.calls._calls import NOW, RANDOM, UUID
from runlog.producers.define._tools import Tool
from runlog.producers.define._workflow import Workflow
from runlog.producers.run._children import ChildRuns, gathering, starting_child
from runlog.producers.run._results import RunResult
from runlog.schemas import ArtifactRef
from runlog.schemas.errors import WorkflowDefinitionError

__all__ = ["AsyncChildRun", "AsyncStageContext", "CallPosition", "ChildRun", "StageContext"]

T = TypeVar("T")


_WAIT_DOC = """Wait for a person or another system: returns the data of the signal named ``signal``.

        The first time, ``RUN_WAITING`` (signal, deadline) is appended and the run is let go: the
        runner flushes, releases the lease and returns; no thread, lease or worker is held while
        it waits. ``runlog signal RUN NAME --data JSON`` (or ``approve`` / ``reject``) appends
        ``SIGNAL_RECEIVED`` and asks for a resume; the resumed stage runs again from its start and
        this call returns the signal's data, a recorded result (reused on any later resume).

        Args:
            timeout: seconds until the wait times out (None: never). The resumers' sweep resumes
                the run at the deadline.
            on_timeout: ``"fail"`` (the stage fails with :class:`WaitTimedOut`, a terminal error)
                or ``"default"`` (``default`` is recorded as the signal's data and returned).
        """


_SLEEP_DOC = """Sleep ``seconds`` durably: the run holds no lease and no thread meanwhile.

        The wake time is decided once, from the log: the first time, ``TOOL_CALLED`` (tool
        ``runlog.sleep``, its arguments holding ``wake_at_ms``) is appended; a re-run of the stage
        after a crash or a resume reads that wake time back, so a run never sleeps twice and never
        longer. With more than 1 s left, ``RUN_WAITING``
        (signal ``runlog.sleep``, deadline = the wake time) is appended and the run is let go like a
        :meth:`wait_for`: it is ``WAITING`` until whichever resumer member is alive at the wake time
        resumes it; the stage then runs again from its start and this call returns at once. A
        shorter sleep is slept in the process, holding the lease. ``runlog signal RUN runlog.sleep``
        wakes a sleeping run early.

        Raises:
            WorkflowDefinitionError: ``seconds`` is not a finite number >= 0.
        """

_SLEEP_UNTIL_DOC = """Sleep until ``when`` (an aware :class:`datetime.datetime`, or seconds since the
        epoch), durably, as :meth:`sleep`. ``when`` is part of the recorded request: compute it from
        something recorded (``ctx.now()``, the run's params, an earlier stage's output), never from the
        wall clock, or a re-run of the stage diverges. A time already past returns at once (recorded).

        Raises:
            WorkflowDefinitionError: ``when`` is a naive datetime or not a finite number.
        """


def _sleep_request(seconds: object) -> dict[str, Any]:
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        raise WorkflowDefinitionError(f"sleep() needs a finite number of seconds >= 0, got {seconds!r}")
    return {"seconds": seconds}


def _until_request(when: object) -> dict[str, Any]:
    if isinstance(when, _dt.datetime):
        if when.tzinfo is None:
            raise WorkflowDefinitionError("sleep_until() needs an aware datetime (with a tzinfo), "
                                          "got a naive one")
        return {"until_ms": round(when.timestamp() * 1000)}
    if isinstance(when, bool) or not isinstance(when, (int, float)) or not math.isfinite(when):
        raise WorkflowDefinitionError(f"sleep_until() needs an aware datetime or epoch seconds, got {when!r}")
    return {"until_ms": round(when * 1000)}


_START_CHILD_DOC = """Start a child run of ``workflow`` with ``params``: a run of its own (its own log,
        lease, resume, branch and audit), linked both ways on the log, executed by the App's resumer
        group (this process need not stay alive). Returns its handle at once; the stage awaits it
        with ``handle.result()`` (or :meth:`gather` for several).

        Starting is exactly once: the child's run key is derived from this run's id and the call's
        position in the stage (plus ``key`` when given), so a re-run of the stage after a crash finds
        the child it started instead of starting another. The call is recorded at its position like
        any call (tool ``runlog.child``): a re-run must start the same workflow with the same params
        there, or the run diverges. The child's payloads are sealed for this run's subject.

        Args:
            workflow: the child's workflow (an App's resumers must register it).
            params: the child's parameters (a JSON object).
            key: an extra part of the child's run key (e.g. the item a fan-out handles).

        Raises:
            WorkflowDefinitionError: not a Workflow, params not a mapping, an empty key, or a runner
                without a run key store.
        """

_GATHER_DOC = """Wait for every child in ``handles`` and return their outcomes in order (a
        :class:`RunResult` each: ``result.outputs[stage]``).

        While any of them goes on, ``RUN_WAITING`` (signal ``runlog.child``) is appended and the run is
        let go (no lease, no thread): it is resumed once all of them have ended, and the stage runs
        again from its start (the children it started are found, not started again). The outcome of
        each child is recorded the first time it is seen ended, so a later re-run reads it back.

        Raises:
            RunFailed, RunCancelled: the first child (in ``handles``' order) that failed or was
                cancelled, once all have ended (unless ``return_exceptions``: then in the list).
            ResumeBlocked: a child is blocked; the stage (and so this run) blocks too, naming it.
        """


class ChildRun:
    """A child run started by a ``def`` stage (:meth:`StageContext.start_child`)."""

    __slots__ = ("_ctx", "call_id", "index", "run_id")

    def __init__(self, ctx: StageContext, index: int, call_id: str, run_id: str) -> None:
        self._ctx = ctx
        self.index = index
        self.call_id = call_id
        """The call that started it in the parent's stage (``<stage>/runlog.child/<index>``)."""
        self.run_id = run_id
        """The child's run id."""

    def result(self) -> RunResult:
        """The child's outcome: its :class:`RunResult` once completed (the run waits meanwhile, holding
        nothing). Raises as :meth:`StageContext.gather` does."""
        out: RunResult = self._ctx.gather(self)[0]
        return out

    def __repr__(self) -> str:
        return f"ChildRun({self.run_id!r}, {self.call_id!r})"


class AsyncChildRun:
    """A child run started by an ``async def`` stage: ``await handle`` (or ``await handle.result()``)."""

    __slots__ = ("_ctx", "call_id", "index", "run_id")

    def __init__(self, ctx: AsyncStageContext, index: int, call_id: str, run_id: str) -> None:
        self._ctx = ctx
        self.index = index
        self.call_id = call_id
        """The call that started it in the parent's stage (``<stage>/runlog.child/<index>``)."""
        self.run_id = run_id
        """The child's run id."""

    async def result(self) -> RunResult:
        """The child's outcome (see :meth:`ChildRun.result`)."""
        out: RunResult = (await self._ctx.gather(self))[0]
        return out

    def __await__(self) -> Any:
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"AsyncChildRun({self.run_id!r}, {self.call_id!r})"


def _positions(ctx: _ContextCore, handles: tuple[Any, ...],
               kind: type[ChildRun] | type[AsyncChildRun]) -> list[tuple[int, str, str]]:
    for h in handles:
        if not isinstance(h, kind) or h._ctx is not ctx:
            raise WorkflowDefinitionError(f"gather() takes handles from this stage's start_child, got {h!r}")
    return [(h.index, h.call_id, h.run_id) for h in handles]


class StageContext(_ContextCore):
    """What a ``def`` stage function gets as ``ctx``; safe to use from several threads."""

    children: ChildRuns | None = None
    """Starts child runs (the runner's part; None: this runner cannot)."""

    def _run(self, steps: Steps[T]) -> T:
        return drive(steps, self._mode)

    def put_artifact(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        """Store bytes; the ref is listed in this stage's ``VERIFIED`` artifacts."""
        return self._run(self.stored.put(data, media_type))

    def call(self, tool: Tool, /, **args: Any) -> Any:
        """Call a tool now and return its result (recorded on the log)."""
        return self._run(self._call_steps(tool, self.positions.claim(), args))

    # -- recorded sources: what stage code reads instead of the clock, random and uuid --------

    def now(self) -> float:
        """Seconds since the epoch, recorded: a resume of this stage reads the same value back."""
        return float(self.call(NOW))

    def random(self) -> float:
        """A float in [0, 1), recorded: a resume of this stage reads the same value back."""
        return float(self.call(RANDOM))

    def uuid(self) -> str:
        """A random UUID (text), recorded: a resume of this stage reads the same value back."""
        return str(self.call(UUID))

    def patched(self, patch_id: str) -> bool:
        """Whether this run takes patch ``patch_id``: True on new code, False when replaying a run
        recorded before the patch existed. Lets a stage change its calls without a new workflow version::

            if ctx.patched("fix-123"):
                ctx.call(new_tool, ...)   # runs that reach this point on the new code
            else:
                ctx.call(old_tool, ...)   # runs recorded before: replayed as they were

        Decided at the stage's next call position. True, recorded as a marker call there (tool
        ``runlog.patched``, request ``{"patch": patch_id}``), when the position lies past every
        call the log records for this stage (a new run, or a resumed one beyond what it recorded),
        or when it holds this patch's marker (a resume of a run that took the patch: True again,
        also after a crash in the middle of the stage). False, recording nothing and taking no call
        position, when the stage's recorded calls go on at or past that position without the marker:
        the calls after it keep the positions they were recorded at, so the determinism guard sees
        the old run's calls. Asked again in the same stage, a patch id answers the same.

        Once no run recorded before the patch can be resumed any more, the ``else`` branch can
        go; keep the ``ctx.patched(patch_id)`` call itself, since a run that recorded the marker,
        resumed on code that no longer asks for it, diverges at the marker's position.

        Raises:
            WorkflowDefinitionError: ``patch_id`` is not a non-empty string.
        """
        with self.patches.asking:  # a second asker of the same patch waits until its marker is appended
            return self._run(self._patched_steps(patch_id))

    def wait_for(self, signal: str, *, timeout: float | None = None, on_timeout: str = "fail",
                 default: Any = None) -> Any:
        return self._run(self._wait_steps(signal, timeout, on_timeout, default))

    wait_for.__doc__ = _WAIT_DOC

    def sleep(self, seconds: float) -> None:
        self._run(self._sleep_steps(_sleep_request(seconds)))

    sleep.__doc__ = _SLEEP_DOC

    def sleep_until(self, when: _dt.datetime | float) -> None:
        self._run(self._sleep_steps(_until_request(when)))

    sleep_until.__doc__ = _SLEEP_UNTIL_DOC

    def start_child(self, workflow: Workflow, params: Mapping[str, Any], *,
                    key: str | None = None) -> ChildRun:
        index, call_id, run_id = self._run(starting_child(self, self.children, workflow, params, key))
        return ChildRun(self, index, call_id, run_id)

    start_child.__doc__ = _START_CHILD_DOC

    def gather(self, *handles: ChildRun, return_exceptions: bool = False) -> list[Any]:
        positions = _positions(self, handles, ChildRun)
        return self._run(gathering(self, self.children, positions, return_exceptions))

    gather.__doc__ = _GATHER_DOC

    def submit(self, tool: Tool, /, **args: Any) -> Future[Any]:
        """Start a tool call in the background; its call index is taken now (submission order)."""
        index = self.positions.claim()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_parallel, thread_name_prefix=f"runlog-{self.stage}")
            fut = self._pool.submit(self._run, self._call_steps(tool, index, args))
            self._futures.append(fut)
        return fut

    def parallel(self, *calls: tuple[Tool, Mapping[str, Any]]) -> list[Any]:
        """Run ``(tool, args)`` calls concurrently; results in order. The first failure is raised
        after all calls have finished."""
        futures = [self.submit(t, **a) for t, a in calls]
        wait(futures)
        return [f.result() for f in futures]

    def finish(self) -> None:
        """Wait for every submitted call (so nothing is appended after the stage ends)."""
        with self._lock:
            futures, pool = list(self._futures), self._pool
        wait(futures)
        if pool is not None:
            pool.shutdown(wait=True)


async def _raise(err: BaseException) -> Any:
    raise err


class CallPosition:
    """A call position of an async stage taken ahead (:meth:`AsyncStageContext.reserve`): the one
    call made through it is recorded there, whenever it is made."""

    __slots__ = ("_ctx", "_used", "index")

    def __init__(self, ctx: AsyncStageContext, index: int) -> None:
        self._ctx = ctx
        self._used = False
        self.index = index
        """The position in the stage (the last part of the call's id)."""

    def call(self, tool: Tool, /, **args: Any) -> Coroutine[Any, Any, Any]:
        """Make this position's call: ``await position.call(tool, **args)``.

        Raises:
            WorkflowDefinitionError: the position was used already.
        """
        if self._used:
            raise WorkflowDefinitionError(f"call position {self.index} of stage {self._ctx.stage!r} "
                                          "was used already: reserve one position per call")
        self._used = True
        return self._ctx._call_at(self.index, tool, args)

    async def start_child(self, workflow: Workflow, params: Mapping[str, Any], *,
                          key: str | None = None) -> AsyncChildRun:
        """Start a child run at this position (:meth:`AsyncStageContext.start_child`): ``await
        position.start_child(workflow, params)`` gives its handle.

        Raises:
            WorkflowDefinitionError: the position was used already (or as ``start_child`` does).
        """
        if self._used:
            raise WorkflowDefinitionError(f"call position {self.index} of stage {self._ctx.stage!r} "
                                          "was used already: reserve one position per call")
        self._used = True
        ctx = self._ctx
        index, call_id, run_id = await ctx._run(starting_child(ctx, ctx.children, workflow, params, key,
                                                               self.index))
        return AsyncChildRun(ctx, index, call_id, run_id)

    def __repr__(self) -> str:
        return f"CallPosition({self._ctx.stage!r}, {self.index})"


class AsyncStageContext(_ContextCore):
    """What an ``async def`` stage function gets as ``ctx``: the same calls, awaited.

    ``await ctx.call(tool, **args)``; concurrent calls with :meth:`submit` (an asyncio task,
    its call index taken at submission) or ``await ctx.parallel((tool, args), ...)``; a ``def``
    tool runs on an executor, an ``async def`` tool on the loop.
    """

    children: ChildRuns | None = None
    """Starts child runs (the runner's part; None: this runner cannot)."""

    def _default_mode(self) -> Mode:
        return INLINE

    async def _run(self, steps: Steps[T]) -> T:
        return await adrive(steps, self._mode)

    async def put_artifact(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        """Store bytes (off the loop); the ref is listed in this stage's ``VERIFIED`` artifacts."""
        return await self._run(self.stored.put(data, media_type))

    def call(self, tool: Tool, /, **args: Any) -> Coroutine[Any, Any, Any]:
        """Call a tool and return its result (recorded on the log): ``await ctx.call(tool, ...)``.

        The call's position in the stage is taken when ``call`` is invoked, before anything is
        awaited: ``await asyncio.gather(ctx.call(a), ctx.call(b))`` gives ``a`` the position before
        ``b``'s whichever finishes first, so a resume whose calls finish in another order is the same
        run to the determinism guard. A call started only after another one's result (a chain in a
        concurrent branch) takes its position then: reserve it first with :meth:`reserve`."""
        try:
            index = self.positions.claim()
        except BaseException as err:  # noqa: BLE001 - the stage failed: raised when awaited, as any call's
            return _raise(err)
        return self._run(self._call_steps(tool, index, args))

    def reserve(self, n: int) -> list[CallPosition]:
        """Take the stage's next ``n`` call positions now, in order; each makes one call later with
        ``await position.call(tool, **args)``, whenever its branch gets there::

            async def branch(pos: list[CallPosition], q: str) -> Any:
                hits = await pos[0].call(search, q=q)
                return await pos[1].call(summarize, hits=hits)   # its position is pos[1], not "next"

            positions = [ctx.reserve(2) for _ in queries]
            out = await asyncio.gather(*(branch(p, q) for p, q in zip(positions, queries)))

        A position left unused stays empty (the same on every re-run of the stage).

        Raises:
            WorkflowDefinitionError: ``n`` is not a positive int.
        """
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise WorkflowDefinitionError(f"reserve() needs a positive number of positions, got {n!r}")
        return [CallPosition(self, i) for i in self.positions.reserve(n)]

    def _call_at(self, index: int, tool: Tool, args: Mapping[str, Any]) -> Coroutine[Any, Any, Any]:
        return self._run(self._call_steps(tool, index, args))

    async def now(self) -> float:
        """Seconds since the epoch, recorded: a resume of this stage reads the same value back."""
        return float(await self.call(NOW))

    async def random(self) -> float:
        """A float in [0, 1), recorded: a resume of this stage reads the same value back."""
        return float(await self.call(RANDOM))

    async def uuid(self) -> str:
        """A random UUID (text), recorded: a resume of this stage reads the same value back."""
        return str(await self.call(UUID))

    async def patched(self, patch_id: str) -> bool:
        """Whether this run takes patch ``patch_id``, as :meth:`StageContext.patched` (awaited):
        True on new code (a marker call recorded), False when replaying a run recorded before the
        patch existed (nothing recorded, no call position taken)."""
        async with self.patches.aasking():  # a second asker of the same patch waits for its marker
            return await self._run(self._patched_steps(patch_id))

    async def wait_for(self, signal: str, *, timeout: float | None = None, on_timeout: str = "fail",
                       default: Any = None) -> Any:
        return await self._run(self._wait_steps(signal, timeout, on_timeout, default))

    wait_for.__doc__ = _WAIT_DOC

    async def sleep(self, seconds: float) -> None:
        await self._run(self._sleep_steps(_sleep_request(seconds)))

    sleep.__doc__ = _SLEEP_DOC

    async def sleep_until(self, when: _dt.datetime | float) -> None:
        await self._run(self._sleep_steps(_until_request(when)))

    sleep_until.__doc__ = _SLEEP_UNTIL_DOC

    async def start_child(self, workflow: Workflow, params: Mapping[str, Any], *,
                          key: str | None = None) -> AsyncChildRun:
        index, call_id, run_id = await self._run(starting_child(self, self.children, workflow, params, key))
        return AsyncChildRun(self, index, call_id, run_id)

    start_child.__doc__ = _START_CHILD_DOC

    async def gather(self, *handles: AsyncChildRun, return_exceptions: bool = False) -> list[Any]:
        return await self._run(gathering(self, self.children, _positions(self, handles, AsyncChildRun),
                                         return_exceptions))

    gather.__doc__ = _GATHER_DOC

    def submit(self, tool: Tool, /, **args: Any) -> asyncio.Task[Any]:
        """Start a tool call as a task on the running loop; its call index is taken now."""
        index = self.positions.claim()
        task = asyncio.ensure_future(self._run(self._call_steps(tool, index, args)))
        self._tasks.append(task)
        return task

    async def parallel(self, *calls: tuple[Tool, Mapping[str, Any]]) -> list[Any]:
        """Run ``(tool, args)`` calls concurrently; results in order. The first failure is raised
        after all calls have finished."""
        tasks = [self.submit(t, **a) for t, a in calls]
        if tasks:
            await asyncio.wait(tasks)
        return [t.result() for t in tasks]

    async def finish(self) -> None:
        """Wait for every submitted call (so nothing is appended after the stage ends)."""
        tasks = [t for t in self._tasks if not t.done()]
        if tasks:
            await asyncio.wait(tasks)
        for t in self._tasks:  # retrieved: a failure already recorded is not "never retrieved"
            if not t.cancelled():
                t.exception()
