"""The console's actions: resolve, cancel, retry, signal, approve, reject.

Each one calls the same function as its CLI command (:mod:`runlog.processors.operate`,
:mod:`runlog.processors.signal`), on a worker thread, after the guard's checks, in this order:
a token is configured, the request comes from this console (Origin / Referer /
Sec-Fetch-Site), the CSRF token belongs to the session cookie, the console token is
right, and someone is named (``by``). A request failing any check is answered 403 (400
for a missing name or a malformed field) before anything is called, so nothing is
appended. A refusal of the action itself (:class:`runlog.processors.operate.OperatorRefused`)
is answered 409 with its message.

A page's script posts with ``Accept: application/json`` and shows the answer in place;
without the script, the form posts normally and gets a page with the same message.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from multidict import MultiDictProxy

from runlog.processors.console._console import CONSOLE, Console
from runlog.processors.console._guard import COOKIE
from runlog.schemas import ConfigError, RunlogError

__all__ = ["ACTIONS", "ActionAnswer", "handler"]

log = logging.getLogger("runlog.console")

ACTIONS = ("resolve", "cancel", "retry", "signal", "approve", "reject")

MAX_FIELD = 2000
"""Longest ``by`` or ``reason`` accepted (they are recorded on the log)."""


@dataclass(frozen=True)
class ActionAnswer:
    """What the page shows after an action."""

    status: int
    ok: bool
    message: str
    result: dict[str, Any] | None = None


class _BadInput(RunlogError):
    """A form field is missing or malformed (answered 400)."""


def _field(form: MultiDictProxy[Any], name: str, *, required: bool = False, limit: int = MAX_FIELD) -> str:
    v = form.get(name)
    text = v.strip() if isinstance(v, str) else ""
    if required and not text:
        raise _BadInput(f"the field {name!r} is required")
    if len(text) > limit:
        raise _BadInput(f"the field {name!r} is longer than {limit} characters")
    if any(ord(c) < 32 and c not in "\t\n\r" for c in text):
        raise _BadInput(f"the field {name!r} holds control characters")
    return text


def _checked(console: Console, request: web.Request, form: MultiDictProxy[Any]) -> ActionAnswer | None:
    """The guard's checks; an answer when the request is refused."""
    guard = console.guard
    presented_csrf = request.headers.get("X-CSRF-Token") or _text(form.get("csrf"))
    for refusal in (guard.check_token(None) if not guard.token_configured else None,
                    guard.check_same_origin(request),
                    guard.check_csrf(request.cookies.get(COOKIE), presented_csrf),
                    guard.check_token(_text(form.get("token")))):
        if refusal is not None:
            return ActionAnswer(refusal.status, False, refusal.message)
    return None


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None


async def _resolve(console: Console, run_id: str, form: MultiDictProxy[Any], by: str) -> ActionAnswer:
    from runlog.processors.operate import resolve_effect

    key = _field(form, "key", required=True, limit=200)
    outcome = _field(form, "outcome", required=True)
    if outcome not in ("done", "not_done"):
        raise _BadInput("outcome must be 'done' or 'not_done'")
    external_id = _field(form, "external_id", limit=500) or None
    reason = _field(form, "reason")
    res = await console.call(resolve_effect, console.settings, run_id, key, done=outcome == "done",
                             external_id=external_id, by=by, reason=reason)
    message = res.detail
    if form.get("resume") == "on":
        from runlog.processors.resume import request_resume

        await console.call(request_resume, console.settings, run_id, f"resolved by {by}: {reason}",
                           requested_by=f"console:{by}")
        message += "; resume requested on the resume topic"
    return ActionAnswer(200, True, message, res.to_dict())


async def _cancel(console: Console, run_id: str, form: MultiDictProxy[Any], by: str) -> ActionAnswer:
    from runlog.processors.operate import cancel_run

    res = await console.call(cancel_run, console.settings, run_id, by=by, reason=_field(form, "reason"))
    return ActionAnswer(200, True, res.detail, res.to_dict())


async def _retry(console: Console, run_id: str, form: MultiDictProxy[Any], by: str) -> ActionAnswer:
    from runlog.processors.operate import OperatorRefused, retry_run

    app = console.app
    if app is None:
        raise OperatorRefused("retry needs the application: start the console with --app module:attribute "
                              "(as for runlog resumer)")
    force = form.get("force") == "on"
    reason = _field(form, "reason")
    task = asyncio.ensure_future(console.call(retry_run, console.settings, app, run_id, by=by, force=force,
                                              reason=reason))
    console.background.add(task)
    task.add_done_callback(console.background.discard)

    def done(t: asyncio.Future[Any]) -> None:
        if not t.cancelled():
            err = t.exception()
            log.info("console retry of %s by %s: %s", run_id, by, err if err else t.result().result)

    task.add_done_callback(done)
    try:
        out = await asyncio.wait_for(asyncio.shield(task), console.options.retry_wait_s)
    except TimeoutError:
        return ActionAnswer(202, True, f"retry of {run_id} started by {by}; it is still running (follow the "
                                       "timeline)")
    doc = {"run_id": out.run_id, "result": out.result, "epoch": out.epoch, "detail": out.detail}
    detail = f" ({out.detail})" if out.detail else ""
    return ActionAnswer(200, out.result not in ("blocked", "failed"),
                        f"retry of {run_id} by {by}: {out.result}{detail}", doc)


async def _signal(console: Console, run_id: str, form: MultiDictProxy[Any], by: str) -> ActionAnswer:
    from runlog.processors.signal import parse_data, signal_run

    name = _field(form, "name", required=True, limit=200)
    data = parse_data(_field(form, "data", limit=64_000) or "null")
    res = await console.call(signal_run, console.settings, run_id, name, data, by=by,
                             reason=_field(form, "reason"))
    return ActionAnswer(200, True, res.detail, res.to_dict())


async def _approve(console: Console, run_id: str, form: MultiDictProxy[Any], by: str) -> ActionAnswer:
    from runlog.processors.signal import APPROVAL, approve_run

    res = await console.call(approve_run, console.settings, run_id, by=by, reason=_field(form, "reason"),
                             name=_field(form, "name", limit=200) or APPROVAL)
    return ActionAnswer(200, True, res.detail, res.to_dict())


async def _reject(console: Console, run_id: str, form: MultiDictProxy[Any], by: str) -> ActionAnswer:
    from runlog.processors.signal import APPROVAL, reject_run

    res = await console.call(reject_run, console.settings, run_id, by=by, reason=_field(form, "reason"),
                             name=_field(form, "name", limit=200) or APPROVAL)
    return ActionAnswer(200, True, res.detail, res.to_dict())


_Run = Callable[[Console, str, MultiDictProxy[Any], str], Awaitable[ActionAnswer]]
_DO: dict[str, _Run] = {"resolve": _resolve, "cancel": _cancel, "retry": _retry, "signal": _signal,
                        "approve": _approve, "reject": _reject}


async def _act(console: Console, request: web.Request, action: str) -> ActionAnswer:
    form = await request.post()
    refused = _checked(console, request, form)
    if refused is not None:
        log.warning("console %s on %s refused: %s", action, request.match_info["run_id"], refused.message)
        return refused
    from runlog.processors.operate import OperatorRefused

    run_id = request.match_info["run_id"]
    try:
        by = _field(form, "by", limit=200)
        if not by:
            return ActionAnswer(400, False, "say who is acting: the 'by' field is required (it is recorded "
                                            "on the log)")
        answer = await _DO[action](console, run_id, form, by)
    except _BadInput as err:
        return ActionAnswer(400, False, str(err))
    except OperatorRefused as err:
        return ActionAnswer(409, False, f"refused: {err}")
    except ConfigError as err:
        return ActionAnswer(400, False, f"configuration: {err}")
    except RunlogError as err:
        log.warning("console %s on %s failed: %s", action, run_id, err)
        return ActionAnswer(500, False, f"{action} failed: {type(err).__name__}: {err}")
    log.info("console %s on %s by %s: %s", action, run_id, by, answer.message)
    return answer


def handler(action: str) -> Callable[[web.Request], Awaitable[web.Response]]:
    """The POST handler of one action."""

    async def handle(request: web.Request) -> web.Response:
        console = request.app[CONSOLE]
        answer = await _act(console, request, action)
        if "application/json" in request.headers.get("Accept", ""):
            return web.json_response({"ok": answer.ok, "action": action, "message": answer.message,
                                      "result": answer.result}, status=answer.status)
        return console.page(request, "result.html.j2", status=answer.status, action=action,
                            run_id=request.match_info["run_id"], answer=answer)

    handle.__name__ = f"{action}_action"
    return handle
