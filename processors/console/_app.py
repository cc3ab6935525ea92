"""The console's aiohttp application: the protective middleware, the routes, and serving it."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import redis
from aiohttp import web

from runlog.processors.console import _actions, _views
from runlog.processors.console._console import CONSOLE, SECURITY_HEADERS, SESSION, Console, ConsoleOptions
from runlog.processors.console._guard import COOKIE, is_loopback
from runlog.processors.console._stream_view import run_stream
from runlog.schemas import ConfigError, RunlogError, Settings

if TYPE_CHECKING:
    from runlog.processors.resume import App

__all__ = ["make_app", "serve"]

log = logging.getLogger("runlog.console")

_STATIC = {"console.js": "application/javascript", "console.css": "text/css"}
_PUBLIC = ("/static/", "/login")


def _refused(status: int, message: str) -> web.Response:
    return web.Response(text=message + "\n", status=status, content_type="text/plain")


@web.middleware
async def _protect(request: web.Request,
                   handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    """Host check, session cookie, sign-in for remote reads, errors as pages, security headers,
    and no credential in any body."""
    console = request.app[CONSOLE]
    guard = console.guard
    refusal = guard.check_host(request)
    if refusal is not None:
        return _refused(refusal.status, refusal.message)
    session = request.cookies.get(COOKIE, "")
    fresh = None
    if not session or len(session) > 128:
        session = fresh = guard.new_session()
    request[SESSION] = session

    def finish(resp: web.StreamResponse) -> None:
        if resp.prepared:  # a live stream set its own headers before it started
            return
        for k, v in SECURITY_HEADERS.items():
            resp.headers.setdefault(k, v)
        if fresh is not None:
            resp.set_cookie(COOKIE, fresh, httponly=True, samesite="Strict", path="/")
        if isinstance(resp, web.Response) and isinstance(resp.body, bytes):
            resp.body = guard.mask(resp.body)

    resp: web.StreamResponse
    try:
        if guard.reads_need_sign_in and not guard.signed_in(session) \
                and not request.path.startswith(_PUBLIC):
            raise web.HTTPSeeOther("/login")
        resp = await handler(request)
    except web.HTTPException as exc:
        finish(exc)
        raise
    except (RunlogError, redis.RedisError) as err:
        log.warning("console %s %s: %s", request.method, request.path, err)
        resp = console.page(request, "error.html.j2", status=503, title="A service did not answer",
                            message=f"{type(err).__name__}: {err}")
    finish(resp)
    return resp


async def _static(request: web.Request) -> web.Response:
    name = request.match_info["name"]
    if name not in _STATIC:
        raise web.HTTPNotFound()
    console = request.app[CONSOLE]
    return web.Response(body=console.static(name), content_type=_STATIC[name],
                        headers={"Cache-Control": "no-cache"})


def make_app(settings: Settings, options: ConsoleOptions | None = None, *,
             app: App | None = None) -> web.Application:
    """The console as an aiohttp application (not started).

    Args:
        settings: services, names, and ``console_token`` (None: every action is refused).
        options: where to listen and what to watch.
        app: the application whose failed runs the retry button resumes (None: retry disabled).
    """
    opts = options or ConsoleOptions()
    console = Console(settings, opts, app)
    web_app = web.Application(middlewares=[_protect], client_max_size=256 * 1024)
    web_app[CONSOLE] = console
    web_app.router.add_get("/", _views.runs_page)
    web_app.router.add_get("/runs", _views.runs_part)
    web_app.router.add_get("/runs/{run_id}", _views.run_page)
    web_app.router.add_get("/runs/{run_id}/live", _views.run_live)
    web_app.router.add_get("/runs/{run_id}/stream", run_stream)
    web_app.router.add_get("/versions", _views.versions_page)
    web_app.router.add_get("/versions/part", _views.versions_part)
    web_app.router.add_get("/api/versions", _views.versions_json)
    web_app.router.add_get("/queues", _views.queues_page)
    web_app.router.add_get("/queues/part", _views.queues_part)
    web_app.router.add_get("/api/queues", _views.queues_json)
    web_app.router.add_get("/health", _views.health_page)
    web_app.router.add_get("/health/part", _views.health_part)
    web_app.router.add_get("/api/runs", _views.runs_json)
    web_app.router.add_get("/api/runs/{run_id}", _views.run_json)
    web_app.router.add_get("/api/health", _views.health_json)
    web_app.router.add_get("/login", _views.login_page)
    web_app.router.add_post("/login", _views.login)
    web_app.router.add_post("/logout", _views.logout)
    web_app.router.add_get("/static/{name}", _static)
    for action in _actions.ACTIONS:
        web_app.router.add_post(f"/runs/{{run_id}}/{action}", _actions.handler(action))

    async def stop_streams(_: web.Application) -> None:
        console.stopping.set()

    async def close_clients(_: web.Application) -> None:
        if console.background:
            await asyncio.wait(console.background, timeout=opts.retry_wait_s)
        await asyncio.to_thread(console.close)

    web_app.on_shutdown.append(stop_streams)
    web_app.on_cleanup.append(close_clients)
    return web_app


def serve(settings: Settings, options: ConsoleOptions | None = None, *, app: App | None = None) -> None:
    """Serve the console until interrupted (``runlog console``).

    Raises:
        ConfigError: a non-loopback ``host`` without ``RUNLOG_CONSOLE_TOKEN``.
    """
    opts = options or ConsoleOptions()
    if not is_loopback(opts.host) and not settings.console_token:
        raise ConfigError(f"serving the console on {opts.host} (not loopback) needs RUNLOG_CONSOLE_TOKEN: "
                          "without it anyone who reaches the port could read every run")
    actions = "enabled (token required)" if settings.console_token else \
        "disabled: RUNLOG_CONSOLE_TOKEN is not set"
    shown_host = f"[{opts.host}]" if ":" in opts.host else opts.host
    print(f"runlog console on http://{shown_host}:{opts.port}/ - actions {actions}", flush=True)
    web.run_app(make_app(settings, opts, app=app), host=opts.host, port=opts.port, print=None,
                shutdown_timeout=5.0)
