"""What the console's handlers share: its options, the :class:`Console` (settings, guard, templates,
clients) and the keys it is stored under."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib import resources
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar

from aiohttp import web
from jinja2 import Environment, PackageLoader, StrictUndefined

from runlog.processors.console._guard import Guard
from runlog.schemas import Settings, Topics, now_ms

if TYPE_CHECKING:
    from runlog.processors.resume import App
    from runlog.projections import RedisStore

__all__ = ["CONSOLE", "SECURITY_HEADERS", "SESSION", "Console", "ConsoleOptions"]

P = ParamSpec("P")
T = TypeVar("T")


@dataclass(frozen=True, kw_only=True)
class ConsoleOptions:
    """How ``runlog console`` serves (the token and the services come from :class:`Settings`)."""

    host: str = "127.0.0.1"
    """Address to listen on; anything but loopback needs ``RUNLOG_CONSOLE_TOKEN`` (pages then
    need a sign-in too)."""
    port: int = 8470
    app_spec: str | None = None
    """``module:attribute`` of the application (shown on the page; retry needs it)."""
    projector_groups: tuple[str, ...] = ("runlog-projector",)
    """Consumer groups of the projector (``runlog project --app-id``), for the health page."""
    projector_metrics_url: str | None = None
    """The projector's Prometheus endpoint (recoveries, lag); default
    ``http://127.0.0.1:$RUNLOG_METRICS_PORT/metrics``, none when the port is 0."""
    poll_interval_s: float = 1.0
    """How often a live run page reads the log for new events."""
    retry_wait_s: float = 5.0
    """How long a retry request waits for the retried run before answering "running"."""
    resume_after_resolve: bool = True
    """Whether the resolve form's "request a resume" box starts checked."""


CONSOLE: web.AppKey[Console] = web.AppKey("console")
SESSION: web.RequestKey[str] = web.RequestKey("session", str)

SECURITY_HEADERS = {
    "Content-Security-Policy": ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
                                "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; "
                                "base-uri 'none'"),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def _age(ms: int) -> str:
    if not ms:
        return "-"
    s = max(0, (now_ms() - ms) // 1000)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _when(ms: int) -> str:
    if not ms:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


class Console:
    """Everything the handlers share: settings, options, the guard, templates, clients."""

    def __init__(self, settings: Settings, options: ConsoleOptions, app: App | None = None) -> None:
        self.settings = settings
        self.options = options
        self.app = app
        self.guard = Guard(settings, host=options.host)
        self.topics = Topics.of(settings)
        self.templates = Environment(loader=PackageLoader("runlog.processors.console", "templates"),
                                     autoescape=True, undefined=StrictUndefined, trim_blocks=True,
                                     lstrip_blocks=True)
        self.templates.filters["age"] = _age
        self.templates.filters["when"] = _when
        self.stopping = asyncio.Event()
        self.background: set[asyncio.Future[Any]] = set()
        self._lock = threading.Lock()
        self._store: RedisStore | None = None
        self._admin: Any = None
        self._static: dict[str, bytes] = {}
        self._opener: Callable[[str], str] | None = None

    @property
    def metrics_url(self) -> str | None:
        if self.options.projector_metrics_url:
            return self.options.projector_metrics_url
        port = self.settings.metrics_port
        return f"http://127.0.0.1:{port}/metrics" if port > 0 else None

    # -- clients, made on first use (on a worker thread) ------------------------------------------

    def store(self) -> RedisStore:
        with self._lock:
            if self._store is None:
                from runlog.projections import RedisStore

                self._store = RedisStore.from_settings(self.settings)
            return self._store

    def admin(self) -> Any:
        with self._lock:
            if self._admin is None:
                from confluent_kafka.admin import AdminClient

                self._admin = AdminClient(self.settings.admin_config())
            return self._admin

    def close(self) -> None:
        with self._lock:
            if self._store is not None:
                self._store.client.close()
                self._store = None
            self._admin = None

    def opens_payloads(self, request: web.Request) -> bool:
        """Whether this request's reader sees sealed texts opened: payloads are encrypted, and the
        session signed in with the console token (everyone else sees ``[sealed]``)."""
        return self.settings.encryption and self.guard.signed_in(request.get(SESSION, ""))

    def opener(self, request: web.Request) -> Callable[[str], str]:
        """Opens a sealed text (an error message, an operator's reason) for a signed-in reader
        (:meth:`opens_payloads`); for anyone else the text stays sealed and shows ``[sealed]``."""
        if not self.opens_payloads(request):
            return str
        with self._lock:
            if self._opener is None:
                from runlog.processors.inspect import text_opener

                self._opener = text_opener(self.settings)
            return self._opener

    async def call(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        """Run a blocking read or action on a worker thread."""
        return await asyncio.to_thread(fn, *args, **kwargs)

    # -- rendering --------------------------------------------------------------------------------

    def context(self, request: web.Request) -> dict[str, Any]:
        """What every page's template gets."""
        session = request.get(SESSION, "")
        return {
            "csrf": self.guard.csrf_for(session) if session else "",
            "token_configured": self.guard.token_configured,
            "signed_in": self.guard.signed_in(session),
            "remote": self.guard.reads_need_sign_in,
            "topic_prefix": self.settings.topic_prefix,
            "redis_prefix": self.settings.redis_prefix,
            "events_topic": self.topics.events,
            "has_app": self.app is not None,
            "app_spec": self.options.app_spec,
            "resume_after_resolve": self.options.resume_after_resolve,
            "path": request.path_qs,
        }

    def render(self, name: str, **ctx: Any) -> str:
        return self.templates.get_template(name).render(**ctx)

    def page(self, request: web.Request, name: str, *, status: int = 200, **ctx: Any) -> web.Response:
        return web.Response(text=self.render(name, **self.context(request), **ctx), status=status,
                            content_type="text/html", charset="utf-8")

    def static(self, name: str) -> bytes:
        if name not in self._static:
            body = resources.files("runlog.processors.console").joinpath("static", name).read_bytes()
            if name == "console.css":  # the audit report's look first, then the console's own rules
                from runlog.processors.audit.html import _CSS

                body = _CSS.encode("utf-8") + body
            self._static[name] = body
        return self._static[name]
