"""The console's read handlers: the run list, a run's live page, health, sign-in for remote reads."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import time
from collections.abc import Callable
from typing import Any

from aiohttp import ClientError, ClientSession, ClientTimeout, web
from confluent_kafka import KafkaException

from runlog.processors.console._console import CONSOLE, SECURITY_HEADERS, SESSION, Console
from runlog.processors.console._guard import COOKIE
from runlog.processors.console._queues_view import fleet_waits
from runlog.processors.console._reads import RunFollower, list_runs, read_health, timeline_items
from runlog.processors.inspect import redact_text, usage_doc
from runlog.processors.inspect.children import ChildNode, child_tree
from runlog.processors.operate import load_run
from runlog.processors.resume._drains import OPEN, version_table
from runlog.processors.resume._versions import VersionRoutes
from runlog.projections import RunState, RunStatus
from runlog.schemas import RunlogError

__all__ = [
    "health_json",
    "health_page",
    "health_part",
    "login",
    "login_page",
    "logout",
    "run_json",
    "run_live",
    "run_page",
    "runs_json",
    "runs_page",
    "runs_part",
    "versions_json",
    "versions_page",
    "versions_part",
]

PING_EVERY_S = 15.0
"""A live stream sends a comment this often, so a closed page is noticed."""

RUN_PARTS = ("summary", "timeline", "checkpoints", "effects", "people")
"""The pieces of a run's page a live update replaces (the actions are replaced only when what
can be done changes, so a half-filled form survives new events)."""


# -- the run list ---------------------------------------------------------------------------------


def _filters(request: web.Request) -> dict[str, str]:
    status = request.query.get("status", "").upper()
    if status and status not in RunStatus.__members__:
        raise web.HTTPBadRequest(text=f"unknown status {status!r}")
    return {"status": status, "workflow": request.query.get("workflow", "")[:200],
            "q": request.query.get("q", "")[:200]}


async def _runs(request: web.Request) -> tuple[Console, dict[str, Any]]:
    console = request.app[CONSOLE]
    f = _filters(request)
    opener = console.opener(request)
    page = await console.call(lambda: list_runs(console.store(), status=f["status"],
                                                workflow=f["workflow"], q=f["q"], opener=opener))
    return console, {"runs": page, "filters": f, "statuses": [s.value for s in RunStatus]}


async def runs_page(request: web.Request) -> web.Response:
    console, ctx = await _runs(request)
    return console.page(request, "runs.html.j2", **ctx)


async def runs_part(request: web.Request) -> web.Response:
    """The live part of the run list (counts, runs needing a person, the table), for refreshing."""
    console, ctx = await _runs(request)
    return console.page(request, "parts/runs.html.j2", **ctx)


async def runs_json(request: web.Request) -> web.Response:
    _, ctx = await _runs(request)
    page = ctx["runs"]
    return web.json_response({"counts": page.counts, "matched": page.matched, "scanned": page.scanned,
                              "runs": [dataclasses.asdict(r) for r in page.rows],
                              "attention": [dataclasses.asdict(r) for r in page.attention]})


# -- workflow versions (runlog versions) ----------------------------------------------------------


async def _versions(request: web.Request) -> tuple[Console, dict[str, Any]]:
    console = request.app[CONSOLE]
    rows, note = await console.call(lambda: version_table(console.store()))
    return console, {"versions": rows, "note": note, "open_statuses": OPEN}


async def versions_page(request: web.Request) -> web.Response:
    console, ctx = await _versions(request)
    return console.page(request, "versions.html.j2", **ctx)


async def versions_part(request: web.Request) -> web.Response:
    console, ctx = await _versions(request)
    return console.page(request, "parts/versions.html.j2", **ctx)


async def versions_json(request: web.Request) -> web.Response:
    _, ctx = await _versions(request)
    return web.json_response({"note": ctx["note"], "versions": [r.to_dict() for r in ctx["versions"]]})


# -- what waits in the fleet (runlog queues) --------------------------------------------------------


async def _queues(request: web.Request) -> tuple[Console, dict[str, Any]]:
    console = request.app[CONSOLE]
    waits = await console.call(lambda: fleet_waits(console.store()))
    return console, {"queues": waits.queues, "limit_waits": waits.limit_waits, "waits": waits}


async def queues_page(request: web.Request) -> web.Response:
    console, ctx = await _queues(request)
    return console.page(request, "queues.html.j2", **ctx)


async def queues_part(request: web.Request) -> web.Response:
    console, ctx = await _queues(request)
    return console.page(request, "parts/queues.html.j2", **ctx)


async def queues_json(request: web.Request) -> web.Response:
    _, ctx = await _queues(request)
    return web.json_response(ctx["waits"].to_dict())


# -- one run --------------------------------------------------------------------------------------


def _actions_key(state: RunState | None, has_app: bool) -> str:
    """What the actions panel depends on: status, open effects, awaited signal."""
    if state is None:
        return "none"
    opened = ",".join(sorted(state.open_effects))
    waiting = state.waiting.signal if state.waiting is not None else ""
    return f"{state.status.value}|{opened}|{waiting}|{int(has_app)}"


def _run_context(console: Console, follower: RunFollower, projected: RunState | None,
                 opener: Callable[[str], str] = str) -> dict[str, Any]:
    run = follower.view(opener)
    state = follower.state
    shown = state or projected
    err = shown.last_error if shown is not None else None
    return {
        # why it stopped: opened for a signed-in reader (Console.opener), else a sealed text is [sealed]
        "reason": "" if err is None else redact_text(f"{err.kind}: {opener(err.message)}"),
        "run_id": follower.run_id,
        "run": run,
        "state": state,
        "items": timeline_items(run) if run is not None else [],
        "projected": projected,
        "open_effects": list(state.open_intents) if state is not None else [],
        "closed_effects": sorted(state.closed_effects.values(), key=lambda e: e.seq) if state else [],
        "actions_key": _actions_key(state, console.app is not None),
        "events": follower.events,
        "version_wait": "",
        "family": None,
    }


async def _follow(console: Console, run_id: str) -> tuple[RunFollower, RunState | None]:
    """The run read from the log once (its follower closed) and its projected state."""
    follower = RunFollower(console.settings, run_id)
    try:
        await console.call(follower.poll)
    finally:
        await console.call(follower.close)
    projected = await console.call(lambda: console.store().load_state(run_id))
    return follower, projected


def _run_id(request: web.Request) -> str:
    run_id = request.match_info["run_id"]
    if not run_id or len(run_id) > 200:
        raise web.HTTPBadRequest(text="bad run id")
    return run_id


async def run_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    follower, projected = await _follow(console, _run_id(request))
    ctx = _run_context(console, follower, projected, console.opener(request))
    if ctx["run"] is None and projected is None:
        return console.page(request, "error.html.j2", status=404, title="No such run",
                            message=f"no run {follower.run_id!r} on the events topic {console.topics.events} "
                            "or in the Redis projection")
    state = ctx["state"] or projected
    if state is not None and state.status.value in ("PENDING", "RUNNING", "WAITING"):
        store = console.store()
        waits = await console.call(lambda: VersionRoutes(store.client, store.prefix).waits([follower.run_id]))
        if follower.run_id in waits:  # a live update after this (the run went on) drops the line
            ctx["version_wait"] = waits[follower.run_id].describe()
    if state is not None and (state.children or (state.parent_run_id and state.parent_call)):
        ctx["family"] = await console.call(_family, console, state)
    return console.page(request, "run.html.j2", **ctx)


def _family(console: Console, state: RunState) -> ChildNode:
    """The tree of child runs under ``state`` (each child's state: the projection, else the log)."""
    return child_tree(state, lambda run_id: load_run(console.settings, run_id))


def _update(console: Console, request: web.Request, follower: RunFollower) -> dict[str, Any]:
    """One live update: the replaced parts of the page and what the actions depend on."""
    ctx = {**console.context(request), **_run_context(console, follower, None, console.opener(request))}
    state = follower.state
    return {
        "run_id": follower.run_id,
        "events": follower.events,
        "status": state.status.value if state is not None else None,
        "last_seq": state.last_seq if state is not None else 0,
        "next_offset": follower.next_offset,
        "parts": {f"run-{p}": console.render(f"parts/run_{p}.html.j2", **ctx) for p in RUN_PARTS},
        "actions_key": ctx["actions_key"],
        "actions": console.render("parts/run_actions.html.j2", **ctx),
    }


async def run_live(request: web.Request) -> web.StreamResponse:
    """Server-sent events: an ``update`` whenever the log holds events of the run the page has not
    drawn (``?after=N``: the page drew N events), a comment every :data:`PING_EVERY_S`."""
    console = request.app[CONSOLE]
    run_id = _run_id(request)
    try:
        after = int(request.query.get("after", "0"))
    except ValueError:
        raise web.HTTPBadRequest(text="after must be a number of events") from None
    follower = RunFollower(console.settings, run_id)
    resp = web.StreamResponse(headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    drawn, pinged = after, time.monotonic()
    try:
        while not console.stopping.is_set():
            try:
                await console.call(follower.poll)
                problem = ""
            except (RunlogError, KafkaException) as err:  # shown on the page; the stream goes on
                problem = f"reading the log failed: {type(err).__name__}: {err}"
            if problem:
                await resp.write(_sse("problem", console.guard.mask_text(json.dumps({"message": problem}))))
            elif follower.events > drawn:
                doc = json.dumps(_update(console, request, follower))
                await resp.write(_sse("update", console.guard.mask_text(doc), event_id=str(follower.events)))
                drawn, pinged = follower.events, time.monotonic()
            elif time.monotonic() - pinged > PING_EVERY_S:
                await resp.write(b": ping\n\n")
                pinged = time.monotonic()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(console.stopping.wait(), console.options.poll_interval_s)
    except ConnectionResetError:
        pass  # the page went away
    finally:
        await console.call(follower.close)
    return resp


def _sse(event: str, data: str, *, event_id: str | None = None) -> bytes:
    lines = [f"event: {event}"]
    if event_id is not None:
        lines.append(f"id: {event_id}")
    lines.extend(f"data: {line}" for line in data.splitlines() or [""])
    return ("\n".join(lines) + "\n\n").encode("utf-8")


async def run_json(request: web.Request) -> web.Response:
    """The run as the audit report shows it (``?after=N`` keeps only events after the first N)."""
    console = request.app[CONSOLE]
    follower, projected = await _follow(console, _run_id(request))
    run = follower.view(console.opener(request))
    if run is None:
        raise web.HTTPNotFound(text=f"no events of run {follower.run_id!r} on {console.topics.events}")
    try:
        after = max(0, int(request.query.get("after", "0")))
    except ValueError:
        raise web.HTTPBadRequest(text="after must be a number of events") from None
    skipped = max(0, after - run["hidden_events"])
    run["events"] = run["events"][skipped:]
    run["projected_seq"] = projected.last_seq if projected is not None else None
    state = follower.state
    run["waiting_for"] = state.waiting.signal if state is not None and state.waiting is not None else None
    run["usage"] = usage_doc(state) if state is not None else None
    return web.json_response(run)


# -- health ---------------------------------------------------------------------------------------


async def _projector_metrics(url: str | None) -> dict[str, Any]:
    """Recoveries, dead letters and lag as the projector's Prometheus endpoint reports them."""
    if url is None:
        return {"url": None, "error": "the projector's metrics are off here (RUNLOG_METRICS_PORT=0); "
                                      "pass --projector-metrics URL"}
    try:
        async with ClientSession(timeout=ClientTimeout(total=2.0)) as http, http.get(url) as r:
            text = await r.text() if r.status == 200 else ""
            if r.status != 200:
                return {"url": url, "error": f"HTTP {r.status}"}
    except (ClientError, TimeoutError, OSError) as err:
        return {"url": url, "error": f"not reachable ({type(err).__name__}): is `runlog project` running "
                                     "on this machine?"}
    out: dict[str, Any] = {"url": url, "error": "", "recoveries": {}, "dead_letters": 0.0, "lag": 0.0}
    for line in text.splitlines():
        if line.startswith("#") or " " not in line:
            continue
        name_labels, _, value = line.rpartition(" ")
        name, _, labels = name_labels.partition("{")
        try:
            v = float(value)
        except ValueError:
            continue
        if name == "runlog_projector_recoveries_total":
            reason = labels.rstrip("}").partition('reason="')[2].rstrip('"') or "all"
            out["recoveries"][reason] = out["recoveries"].get(reason, 0.0) + v
        elif name == "runlog_projector_dead_letters_total":
            out["dead_letters"] += v
        elif name == "runlog_projector_consumer_lag":
            out["lag"] += v
    return out


async def _health(request: web.Request) -> tuple[Console, dict[str, Any]]:
    console = request.app[CONSOLE]
    health, metrics = await asyncio.gather(
        console.call(lambda: read_health(console.settings, console.store(), console.admin(),
                                         projector_groups=console.options.projector_groups)),
        _projector_metrics(console.metrics_url))
    return console, {"health": health, "metrics": metrics, "topics": console.topics,
                     "resumer_prefix": console.settings.group_id(console.settings.resumer_group + ".")}


async def health_page(request: web.Request) -> web.Response:
    console, ctx = await _health(request)
    return console.page(request, "health.html.j2", **ctx)


async def health_part(request: web.Request) -> web.Response:
    console, ctx = await _health(request)
    return console.page(request, "parts/health.html.j2", **ctx)


async def health_json(request: web.Request) -> web.Response:
    _, ctx = await _health(request)
    return web.json_response({**dataclasses.asdict(ctx["health"]), "projector_metrics": ctx["metrics"]})


# -- sign-in (pages on a non-loopback address) ----------------------------------------------------


async def login_page(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    return console.page(request, "login.html.j2", message="")


async def login(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    guard = console.guard
    form = await request.post()
    session = request[SESSION]
    refusal = (guard.check_same_origin(request)
               or guard.check_csrf(request.cookies.get(COOKIE), _text(form.get("csrf")))
               or guard.check_token(_text(form.get("token"))))
    if refusal is not None:
        return console.page(request, "login.html.j2", status=refusal.status, message=refusal.message)
    guard.sign_in(session)
    raise web.HTTPSeeOther("/")


async def logout(request: web.Request) -> web.Response:
    console = request.app[CONSOLE]
    refusal = console.guard.check_same_origin(request)
    if refusal is not None:
        raise web.HTTPForbidden(text=refusal.message)
    console.guard.sign_out(request.cookies.get(COOKIE))
    raise web.HTTPSeeOther("/login" if console.guard.reads_need_sign_in else "/")


def _text(v: Any) -> str | None:
    return v if isinstance(v, str) else None
