"""What a counterfactual replay (``runlog replay``, :mod:`runlog.processors.replay`) puts between a call and
its tool.

A replay is a new run, in a namespace of its own, of a recorded run's workflow. Before a tool of the
replay's run is executed, the call path asks :func:`tool_function` for the function to run: for a
run a replay registered (:func:`register`), a shim that asks the replay's :data:`Interceptor` first.
The interceptor answers with the recorded result to serve instead of executing the tool, with
:data:`EXECUTE` to run the tool as usual (a SAFE read whose request changed, a model call made anew),
or raises :class:`NotReplayed` to stop the run there (an effect whose request is not the recorded
one: a replay never executes an effect). For every other run the tool's own function is returned,
and this costs one dictionary lookup per call.

The registry is keyed by run id, not by context, so the calls of one run find it from any thread or
task the runner uses.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from runlog.schemas.errors import TerminalToolError

if TYPE_CHECKING:
    from runlog.producers.define._tools import CallInfo, Tool

__all__ = ["EXECUTE", "Interceptor", "NotReplayed", "model_override", "register", "registered",
           "tool_function", "unregister"]

EXECUTE: Any = object()
"""An interceptor's answer: run the tool itself."""

Interceptor = Callable[["Tool", "CallInfo", Mapping[str, Any]], Any]
"""``(tool, call, args) -> result to serve | EXECUTE``; raises :class:`NotReplayed` to stop."""

_lock = threading.Lock()
_interceptors: dict[str, Interceptor] = {}
_models: dict[str, str] = {}


class NotReplayed(TerminalToolError):
    """A call a replay does not make (an effect whose request differs from the recorded one, or that
    the recorded run never made): the replay stops there."""


def register(run_id: str, interceptor: Interceptor, model: str | None = None) -> None:
    """Intercept the tool calls of ``run_id`` until :func:`unregister`; ``model``: the model the
    run's agents use instead of their own (:func:`model_override`)."""
    with _lock:
        _interceptors[run_id] = interceptor
        if model:
            _models[run_id] = model


def unregister(run_id: str) -> None:
    with _lock:
        _interceptors.pop(run_id, None)
        _models.pop(run_id, None)


def model_override(run_id: str) -> str | None:
    """The model a replay asked ``run_id``'s agents to use (``runlog replay --model``), or None."""
    return _models.get(run_id)


def registered(run_id: str) -> bool:
    return run_id in _interceptors


def tool_function(tool: Tool, run_id: str) -> Callable[..., Any]:
    """The function the call path runs for ``tool`` in ``run_id``: the tool's own, or the replay's
    shim (``def`` or ``async def`` as the tool is)."""
    icp = _interceptors.get(run_id)
    if icp is None:
        return tool.fn
    from runlog.producers.base._protocol import is_async_fn

    fn = tool.fn
    if is_async_fn(fn):
        async def ashim(call: CallInfo, **args: Any) -> Any:
            served = icp(tool, call, args)
            return (await fn(call, **args)) if served is EXECUTE else served
        return ashim

    def shim(call: CallInfo, **args: Any) -> Any:
        served = icp(tool, call, args)
        return fn(call, **args) if served is EXECUTE else served
    return shim
