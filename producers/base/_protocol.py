"""One implementation of the protocol, driven synchronously or on an asyncio loop.

The write protocol (start a run, run a stage, make a tool call: guard, ledger, intent,
retry, reconcile, verify) and the SDK's Redis round trips (:mod:`runlog.producers.base._redis_io`)
are written once, as generators that *yield* the I/O they need and get its result back (a
sans-I/O core). Every step is a :class:`Step` ``[T]``, and a protocol takes a step's result with
``result = yield from step``: a step iterates as a one-step generator returning ``T``, so the type
checker follows the value a step sends back (:data:`Steps` sends ``object``, so a bare
``x: T = yield step`` is an error). The kinds of step:

* :class:`IO`: a port's method with a sync and an async face, named as bound methods with
  :func:`io` (``io(lease.verify, lease.averify)``, ``io(session.append, session.aappend, type)``);
* :class:`Invoke`: user code (a stage, tool or reconcile function), ``def`` or ``async def``;
* :class:`Sleep`: a retry's back-off;
* :class:`~runlog.producers.base._redis_io.RoundTrip`: one Redis round trip on the client the driving
  mode holds.

A :class:`Mode` carries the steps out; :func:`drive` runs a protocol in a sync mode, :func:`adrive`
awaits it in an async one. The sync :class:`Runner` uses :data:`SYNC` (every step blocks the
calling thread); an ``async def`` stage under it runs on a private loop with :data:`INLINE` (port
calls block that loop, user coroutines are awaited). The :class:`~runlog.producers.AsyncRunner`
uses :class:`LoopMode` (ports awaited on the loop, sync user code on an executor) and, for a ``def``
stage it runs on a worker thread, :class:`ThreadMode` (port calls hop onto the loop, user code stays
on the stage's thread).

Because the steps are the same generator in every mode, there is no second copy of the
append, lease, ledger, reuse, reconcile or verification logic.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import time
from collections.abc import Awaitable, Callable, Generator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, Generic, ParamSpec, TypeVar, cast

__all__ = [
    "INLINE",
    "IO",
    "SYNC",
    "Invoke",
    "LoopMode",
    "Mode",
    "Sleep",
    "Step",
    "Steps",
    "ThreadMode",
    "adrive",
    "drive",
    "io",
    "is_async_fn",
]

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


def is_async_fn(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (``async def``, also behind partials/callables)."""
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = None if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__dict__.get("__call__")
    return inspect.iscoroutinefunction(call)


class Step(Generic[T]):
    """One unit of I/O a protocol yields; the driver sends back its result, a ``T``.

    ``result = yield from step`` yields the step and returns what the driver sent back, typed ``T``.
    """

    __slots__ = ()

    def __iter__(self) -> Generator[Step[T], T, T]:
        return (yield self)


Steps = Generator[Step[Any], object, R]
"""A protocol generator: yields steps, returns its result (an ``R``). Results come back through
``yield from step`` (typed); the send type ``object`` makes a bare ``x: T = yield step`` a type error."""


@dataclass(frozen=True, slots=True)
class IO(Step[T]):
    """A port call with two faces: ``call()`` blocks, ``await acall()`` on an event loop. Built with
    :func:`io` from a pair of bound methods of the same signature."""

    call: Callable[[], T]
    acall: Callable[[], Awaitable[T]]


def io(sync: Callable[P, T], async_: Callable[P, Awaitable[T]], /,
       *args: P.args, **kwargs: P.kwargs) -> IO[T]:
    """The step ``sync(*args, **kwargs)`` or ``await async_(*args, **kwargs)``, whichever face the
    driving mode uses, e.g. ``lease = yield from io(leases.acquire, leases.aacquire, run_id)``."""
    return IO(functools.partial(sync, *args, **kwargs), functools.partial(async_, *args, **kwargs))


@dataclass(frozen=True, slots=True)
class Invoke(Step[Any]):
    """User code: ``fn(*args, **kwargs)``, awaited when it is a coroutine function."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sleep(Step[None]):
    seconds: float


class Mode:
    """How steps are carried out. Exactly one of :meth:`run` (a sync mode, :func:`drive`) and
    :meth:`arun` (an async one, :func:`adrive`) is used per mode."""

    def run(self, step: Step[T]) -> T:
        raise NotImplementedError(f"{type(self).__name__} is an async mode")

    async def arun(self, step: Step[T]) -> T:
        raise NotImplementedError(f"{type(self).__name__} is a sync mode")


def _unknown(mode: Mode, step: Step[Any]) -> TypeError:
    return TypeError(f"{type(mode).__name__} does not carry out a {type(step).__name__} step")


class _Sync(Mode):
    """Everything blocks the calling thread (the sync Runner)."""

    def run(self, step: Step[T]) -> T:
        if isinstance(step, IO):
            return cast(T, step.call())
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return cast(T, None)
        if isinstance(step, Invoke):
            if is_async_fn(step.fn):
                # an async tool in a def stage
                return cast(T, asyncio.run(step.fn(*step.args, **step.kwargs)))
            return cast(T, step.fn(*step.args, **step.kwargs))
        raise _unknown(self, step)


class _Inline(Mode):
    """An ``async def`` stage under the sync Runner: port calls block its private loop."""

    async def arun(self, step: Step[T]) -> T:
        if isinstance(step, IO):
            return cast(T, step.call())
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return cast(T, None)
        if isinstance(step, Invoke):
            out = step.fn(*step.args, **step.kwargs)
            return cast(T, (await out) if inspect.isawaitable(out) else out)
        raise _unknown(self, step)


SYNC: Mode = _Sync()
INLINE: Mode = _Inline()


class LoopMode(Mode):
    """The AsyncRunner's loop: ports awaited, sync user code on ``executor``."""

    def __init__(self, executor: Executor | None = None) -> None:
        self.executor = executor

    async def arun(self, step: Step[T]) -> T:
        if isinstance(step, IO):
            return cast(T, await step.acall())
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return cast(T, None)
        if isinstance(step, Invoke):
            if is_async_fn(step.fn):
                return cast(T, await step.fn(*step.args, **step.kwargs))
            loop = asyncio.get_running_loop()
            fn, args, kwargs = step.fn, step.args, step.kwargs
            return cast(T, await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs)))
        raise _unknown(self, step)


class ThreadMode(Mode):
    """A ``def`` stage the AsyncRunner runs on a worker thread: port calls hop onto ``loop``,
    sync user code runs right here, coroutines are run on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, step: Step[T]) -> T:
        if isinstance(step, IO):
            return cast(T, asyncio.run_coroutine_threadsafe(_awaited(step.acall()), self.loop).result())
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return cast(T, None)
        if isinstance(step, Invoke):
            if is_async_fn(step.fn):
                coro = step.fn(*step.args, **step.kwargs)
                return cast(T, asyncio.run_coroutine_threadsafe(coro, self.loop).result())
            return cast(T, step.fn(*step.args, **step.kwargs))
        raise _unknown(self, step)


async def _awaited(aw: Awaitable[T]) -> T:
    return await aw


Driven = Generator[Step[Any], Any, T]
"""What the drivers take: a protocol (:data:`Steps`), or a single step's iteration."""


def _advance(steps: Driven[Any], value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand the last step's value (or error) to the generator: ``(True, result)`` when it
    returned, ``(False, next step)`` otherwise."""
    try:
        return False, (steps.throw(error) if error is not None else steps.send(value))
    except StopIteration as stop:
        return True, stop.value


def drive(steps: Driven[T], mode: Mode = SYNC) -> T:
    """Run a protocol generator to its end, each step blocking (a sync mode). A step's error is
    thrown into the generator: its handlers decide."""
    value: Any = None
    error: BaseException | None = None
    while True:
        done, x = _advance(steps, value, error)
        if done:
            return cast(T, x)
        try:
            value, error = mode.run(x), None
        except BaseException as err:  # noqa: BLE001
            value, error = None, err


async def adrive(steps: Driven[T], mode: Mode) -> T:
    """:func:`drive` on the running loop (an async mode), each step awaited."""
    value: Any = None
    error: BaseException | None = None
    while True:
        done, x = _advance(steps, value, error)
        if done:
            return cast(T, x)
        try:
            value, error = await mode.arun(x), None
        except BaseException as err:  # noqa: BLE001
            value, error = None, err
