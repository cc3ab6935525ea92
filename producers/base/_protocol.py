"""One implementation of the protocol, driven synchronously or on an asyncio loop.

The write protocol (start a run, run a stage, make a tool call: guard, ledger, intent,
retry, reconcile, verify) is written once, as generators that *yield* the I/O they need
and get its result back (a sans-I/O core). Three kinds of step:

* :class:`IO`: a port method with a sync and an async face (``session.append`` /
  ``session.aappend``, ``lease.verify`` / ``lease.averify``, ``ledger.open`` /
  ``ledger.aopen``, ...);
* :class:`Invoke`: user code (a stage, tool or reconcile function), ``def`` or ``async def``;
* :class:`Sleep`: a retry's back-off.

A :class:`Mode` carries the steps out. The sync :class:`Runner` uses :data:`SYNC` (every
step blocks the calling thread); an ``async def`` stage under it runs on a private loop with
:data:`INLINE` (port calls block that loop, user coroutines are awaited). The
:class:`~runlog.producers.AsyncRunner` uses :class:`LoopMode` (ports awaited on the loop, sync user
code on an executor) and, for a ``def`` stage it runs on a worker thread,
:class:`ThreadMode` (port calls hop onto the loop, user code stays on the stage's thread).

Because the steps are the same generator in every mode, there is no second copy of the
append, lease, ledger, reuse, reconcile or verification logic.
"""

from __future__ import annotations

import asyncio
import inspect
import time
from collections.abc import Callable, Coroutine, Generator
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

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
    "is_async_fn",
]

T = TypeVar("T")


def is_async_fn(fn: Any) -> bool:
    """Whether calling ``fn`` returns a coroutine (``async def``, also behind partials/callables)."""
    while hasattr(fn, "func"):  # functools.partial
        fn = fn.func
    if inspect.iscoroutinefunction(fn):
        return True
    call = None if inspect.isfunction(fn) or inspect.ismethod(fn) else type(fn).__dict__.get("__call__")
    return inspect.iscoroutinefunction(call)


@dataclass(frozen=True, slots=True)
class IO:
    """``obj.<sync>(*args, **kwargs)`` or ``await obj.<async_>(*args, **kwargs)``."""

    obj: Any
    sync: str
    async_: str
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)

    def call(self) -> Any:
        return getattr(self.obj, self.sync)(*self.args, **self.kwargs)

    def acall(self) -> Coroutine[Any, Any, Any]:
        coro: Coroutine[Any, Any, Any] = getattr(self.obj, self.async_)(*self.args, **self.kwargs)
        return coro


@dataclass(frozen=True, slots=True)
class Invoke:
    """User code: ``fn(*args, **kwargs)``, awaited when it is a coroutine function."""

    fn: Callable[..., Any]
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class Sleep:
    seconds: float


Step = IO | Invoke | Sleep
Steps = Generator[Step, Any, T]
"""A protocol generator: yields steps, returns its result."""


class Mode:
    """How steps are carried out. Exactly one of :meth:`run` / :meth:`arun` is used per mode."""

    def run(self, step: Step) -> Any:
        raise NotImplementedError(f"{type(self).__name__} is an async mode")

    async def arun(self, step: Step) -> Any:
        raise NotImplementedError(f"{type(self).__name__} is a sync mode")

    is_async = False


class _Sync(Mode):
    """Everything blocks the calling thread (the sync Runner)."""

    def run(self, step: Step) -> Any:
        if isinstance(step, IO):
            return step.call()
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        if is_async_fn(step.fn):
            return asyncio.run(step.fn(*step.args, **step.kwargs))  # an async tool in a def stage
        return step.fn(*step.args, **step.kwargs)


class _Inline(Mode):
    """An ``async def`` stage under the sync Runner: port calls block its private loop."""

    is_async = True

    async def arun(self, step: Step) -> Any:
        if isinstance(step, IO):
            return step.call()
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        out = step.fn(*step.args, **step.kwargs)
        return (await out) if inspect.isawaitable(out) else out


SYNC: Mode = _Sync()
INLINE: Mode = _Inline()


class LoopMode(Mode):
    """The AsyncRunner's loop: ports awaited, sync user code on ``executor``."""

    is_async = True

    def __init__(self, executor: Executor | None = None) -> None:
        self.executor = executor

    async def arun(self, step: Step) -> Any:
        if isinstance(step, IO):
            return await step.acall()
        if isinstance(step, Sleep):
            await asyncio.sleep(step.seconds)
            return None
        if is_async_fn(step.fn):
            return await step.fn(*step.args, **step.kwargs)
        loop = asyncio.get_running_loop()
        fn, args, kwargs = step.fn, step.args, step.kwargs
        return await loop.run_in_executor(self.executor, lambda: fn(*args, **kwargs))


class ThreadMode(Mode):
    """A ``def`` stage the AsyncRunner runs on a worker thread: port calls hop onto ``loop``,
    sync user code runs right here, coroutines are run on the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop

    def run(self, step: Step) -> Any:
        if isinstance(step, IO):
            return asyncio.run_coroutine_threadsafe(step.acall(), self.loop).result()
        if isinstance(step, Sleep):
            time.sleep(step.seconds)
            return None
        if is_async_fn(step.fn):
            coro = step.fn(*step.args, **step.kwargs)
            return asyncio.run_coroutine_threadsafe(coro, self.loop).result()
        return step.fn(*step.args, **step.kwargs)


def _advance(steps: Steps[Any], value: Any, error: BaseException | None) -> tuple[bool, Any]:
    """Hand the last step's value (or error) to the generator: ``(True, result)`` when it
    returned, ``(False, next step)`` otherwise."""
    try:
        return False, (steps.throw(error) if error is not None else steps.send(value))
    except StopIteration as stop:
        return True, stop.value


def drive(steps: Steps[T], mode: Mode = SYNC) -> T:
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


async def adrive(steps: Steps[T], mode: Mode) -> T:
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
