"""Faust's own ceilings: the projector's Faust app with nothing in its agent.

The projector is a Faust agent that used to take its records through Faust's per-record stream
(``stream.take_events``); it now takes whole fetches below it (:mod:`runlog.processors.projector._batches`),
then folds and applies them on a worker thread. Faust's per-record consumption (aiokafka's fetcher, one
``Event`` per record through the stream, the acknowledgements Faust tracks to commit offsets) costs
Python time per record that the raw projector baseline (the raw client's batched ``consume``) never pays.
This measures it in the same run: the same Faust settings, topic and batching as ``runlog project``, an
agent that only counts the events it takes (one ``INCRBY`` per batch), so the projector's throughput can
be read against the most Faust delivers here. ``batches=True`` measures the path the projector takes
instead: the same app with Faust's consumer handing whole fetches to the agent below the per-record
stream (:mod:`runlog.processors.projector._batches`), the agent counting and acknowledging them.
"""

from __future__ import annotations

import os
import time
from multiprocessing.process import BaseProcess
from typing import Any

from runlog.processors.bench._env import BenchEnv
from runlog.processors.projector import ProjectorOptions, faust_settings
from runlog.schemas.errors import RunlogError
from runlog.schemas.internal import redis_client
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["bench_stream_ceiling"]


def _stream_main(settings: Settings, opts: ProjectorOptions, workdir: str, key: str, batches: bool) -> None:
    import faust

    from runlog.processors.projector._batches import BatchDelivery, install

    os.chdir(workdir)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.dup2(devnull, 2)
    app = faust.App(settings.group_id(opts.app_id), **faust_settings(settings, opts))
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes, "key_serializer": "raw",
                           "value_serializer": "raw"}
    name = Topics.of(settings).events
    delivery = BatchDelivery(name, max_pending=max(4 * opts.batch_size, 5000))
    if batches:
        install(app, [delivery], fetch_min_bytes=opts.fetch_min_bytes, fetch_wait_ms=opts.fetch_wait_ms)
    events = app.topic(name, **raw)
    counter = redis_client(settings)

    async def count(stream: Any) -> None:
        if batches:
            app.topics.add(events.clone(is_iterator=True))
            while True:
                got = await delivery.take(opts.batch_size, opts.within)
                counter.incrby(key, len(got))
                delivery.ack(got)
        async for batch in stream.take_events(opts.batch_size, within=opts.within):
            counter.incrby(key, len(batch))

    app.agent(events, name="count")(count)
    faust.Worker(app, loglevel="WARNING", quiet=True).execute_from_commandline()


def _start(env: BenchEnv, settings: Settings, name: str, key: str, batches: bool) -> BaseProcess:
    d = ProjectorOptions()
    o = ProjectorOptions(app_id=f"bench-{env.tag}-{name}", batch_size=d.batch_size, within=d.within)
    return env.start_child(_stream_main, (settings, o, env.workdir, key, batches))


def bench_stream_ceiling(env: BenchEnv, settings: Settings, total: int, *, rounds: int, tick: Any,
                         timeout: float = 600.0, batches: bool = False) -> list[float]:
    """Events/s Faust delivers to an agent that does nothing with them, one per round: the rate
    from the first batch counted to the last of ``total`` events (``batches``: whole fetches below
    the per-record stream, as the projector takes them)."""
    rates = []
    what = "batches" if batches else "stream"
    for rnd in range(rounds):
        key = f"{settings.redis_prefix}.{what}{rnd}:count"
        t_start = time.monotonic()
        child = _start(env, settings, f"{what}{rnd}", key, batches)
        try:
            first: tuple[float, int] | None = None
            end = time.monotonic() + timeout
            while True:
                n = int(env.redis.get(key) or 0)
                now = time.monotonic()
                if n and first is None:
                    first = (now, n)
                if n >= total:
                    break
                if now > end:
                    raise RunlogError(f"bench: Faust's {what} delivered {n}/{total} events in {timeout:.0f}s")
                time.sleep(0.05)
            assert first is not None
            if total > first[1]:
                rates.append((total - first[1]) / max(now - first[0], 1e-6))
            else:  # everything came in one poll: the rate since the start (an underestimate)
                rates.append(total / max(now - t_start, 1e-6))
        finally:
            env.stop(child)
            env.redis.delete(key)
        tick(f"Faust {what} alone, round {rnd + 1}")
    return rates
