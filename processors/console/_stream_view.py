"""A run's streamed model output in the console: ``/runs/RUN/stream``, server-sent events from the
streams topic (:mod:`runlog.processors.streams`). Each record is an event ``record`` whose ``id`` is its
offset, so a browser's ``EventSource`` that lost its connection reconnects with ``Last-Event-ID``
and the stream resumes right after the last record it got (``?from=OFFSET`` starts elsewhere; the
default is 0, the oldest kept). A record that does not decode is an event ``undecodable`` with its
offset and reason (the console reports it; ``runlog tail`` dead-letters it)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time

from aiohttp import web
from confluent_kafka import KafkaException

from runlog.processors.console._console import CONSOLE, SECURITY_HEADERS
from runlog.processors.streams import StreamEntry, StreamReader
from runlog.producers.internal import TEXT_PREFIX
from runlog.schemas import RunlogError

__all__ = ["run_stream", "start_offset"]

PING_EVERY_S = 15.0


def start_offset(query_from: str | None, last_event_id: str | None) -> int:
    """Where a stream request starts: after ``Last-Event-ID`` (a reconnect), else ``?from``, else 0.

    Raises:
        web.HTTPBadRequest: not a non-negative number.
    """
    try:
        if last_event_id:
            return int(last_event_id) + 1
        value = int(query_from or "0")
    except ValueError:
        raise web.HTTPBadRequest(text="from and Last-Event-ID must be stream offsets") from None
    if value < 0:
        raise web.HTTPBadRequest(text="from must be 0 or more")
    return value


def _shown(text: str | None) -> str | None:
    """A record's text or data as the reader may see it: one left sealed (a reader who has not
    signed in) is ``[sealed]``."""
    return "[sealed]" if text is not None and text.startswith(TEXT_PREFIX) else text


def _event(entry: StreamEntry) -> bytes:
    r, err = entry.record, entry.error
    if r is None:
        assert err is not None
        kind, doc = "undecodable", {"offset": entry.offset, "reason": err.reason, "detail": err.detail}
    else:
        kind, doc = "record", {"offset": entry.offset, "kind": r.kind.value, "call_id": r.call_id,
                               "stage": r.stage, "epoch": r.epoch, "attempt": r.attempt, "index": r.index,
                               "part": r.part, "text": _shown(r.text), "data": _shown(r.data)}
    return f"event: {kind}\nid: {entry.offset}\ndata: {json.dumps(doc)}\n\n".encode()


async def run_stream(request: web.Request) -> web.StreamResponse:
    """Server-sent events of the run's stream records from an offset (see the module docstring)."""
    console = request.app[CONSOLE]
    run_id = request.match_info["run_id"]
    if not run_id or len(run_id) > 200:
        raise web.HTTPBadRequest(text="bad run id")
    offset = start_offset(request.query.get("from"), request.headers.get("Last-Event-ID"))
    try:
        # the texts opened for a signed-in reader only (Console.opens_payloads); [sealed] for others
        reader = await console.call(lambda: StreamReader(console.settings, run_id, from_offset=offset,
                                                         opened=console.opens_payloads(request)))
    except RunlogError as err:
        why = console.guard.mask_text(f"{type(err).__name__}: {err}")
        raise web.HTTPServiceUnavailable(text=why) from None
    resp = web.StreamResponse(headers={**SECURITY_HEADERS, "Content-Type": "text/event-stream",
                                       "X-Accel-Buffering": "no"})
    await resp.prepare(request)
    pinged = time.monotonic()
    try:
        while not console.stopping.is_set():
            try:
                entries = await console.call(reader.poll, 0.2)
            except (RunlogError, KafkaException) as err:  # shown to the reader; the stream goes on
                msg = json.dumps({"message": f"reading the stream failed: {type(err).__name__}: {err}"})
                await resp.write(f"event: problem\ndata: {console.guard.mask_text(msg)}\n\n".encode())
                entries = []
            for entry in entries:
                await resp.write(console.guard.mask(_event(entry)))
                pinged = time.monotonic()
            if not entries and time.monotonic() - pinged > PING_EVERY_S:
                await resp.write(b": ping\n\n")
                pinged = time.monotonic()
            if not entries:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(console.stopping.wait(), 0.05)
    except ConnectionResetError:
        pass  # the reader went away
    finally:
        await console.call(reader.close)
    return resp
