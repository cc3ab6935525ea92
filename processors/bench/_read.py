"""Read-path benchmarks: the projector, end-to-end lag, rebuild, each against a raw-client baseline.

Delivery semantics: the projector under test is the real one (at-least-once,
idempotent apply); the baselines read with plain assigned consumers and commit
nothing.
"""

from __future__ import annotations

import io
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import fastavro
import redis
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from runlog.processors.bench._env import BenchEnv, end_offsets, peak_rss_kib
from runlog.processors.bench._events import history, median, percentile, ratio
from runlog.processors.bench._stream import bench_stream_ceiling
from runlog.processors.bench._write import _plain_schema, avro_body
from runlog.producers.internal import RunWriter
from runlog.projections import RedisStore, RunState, RunStatus, RunUpdate, apply_script, fold_all, rebuild
from runlog.schemas import load_schema
from runlog.schemas.errors import RunlogError
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["bench_lag", "bench_projector", "bench_rebuild", "measure_capacity", "populate"]

Tick = Callable[[str], None]


def populate(env: BenchEnv, settings: Settings, *, events: int, runs: int, tag: str) -> list[str]:
    """Write ``events`` bench events over ``runs`` runs, interleaved, to the events topic."""
    per_run = events // runs
    ids = [f"run-{tag}-{r:05d}" for r in range(runs)]
    hists = [list(history(r, 1, per_run)) for r in ids]
    env.produce_events(settings, [h[i] for i in range(per_run) for h in hists])
    return ids


def _fetch(settings: Settings, topic: str) -> list[tuple[int, int, bytes, bytes]]:
    """Every record of a topic (partition, offset, key, value), by plain assigned consumption."""
    c = Consumer(settings.consumer_config("bench-read", **{"enable.partition.eof": False}))
    out: list[tuple[int, int, bytes, bytes]] = []
    try:
        ends = end_offsets(c, topic)
        todo = {p for p, e in ends.items() if e > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        idle = 0
        while todo and idle < 30:
            msgs = c.consume(num_messages=2000, timeout=1.0)
            idle = 0 if msgs else idle + 1
            for m in msgs:
                if m.error() is not None:
                    continue
                p, o = m.partition(), m.offset()
                out.append((p, o, m.key(), m.value()))
                if o >= ends[p] - 1:
                    todo.discard(p)
    finally:
        c.close()
    return out


def _watch(env: BenchEnv, prefix: str, ids: list[str], total: int, child_pids: list[int], marks: list[int],
           timeout: float) -> dict[str, Any]:
    """Poll Redis until every event is projected: rate from the first visible event, RSS at marks."""
    t_first = a_first = None
    rss_at: dict[str, int] = {}
    t_start = time.monotonic()
    end = t_start + timeout
    applied = 0
    while time.monotonic() < end:
        applied = sum(env.last_seqs(prefix, ids))
        now = time.monotonic()
        if applied and t_first is None:
            t_first, a_first = now, applied
        for m in marks:
            if applied >= m and str(m) not in rss_at:
                rss_at[str(m)] = sum(max(peak_rss_kib(p), 0) for p in child_pids)
        if applied >= total:
            break
        time.sleep(0.1)
    else:
        raise RunlogError(f"bench: projector reached {applied}/{total} events in {timeout:.0f}s")
    assert t_first is not None and a_first is not None
    if total > a_first:
        secs = max(now - t_first, 1e-6)
        rate = (total - a_first) / secs
    else:  # everything became visible within one poll: fall back to the time since the start
        secs = max(now - t_start, 1e-6)
        rate = total / secs
    return {"events_per_s": rate,
            "seconds": secs, "peak_rss_kib_at": rss_at}


def run_group(env: BenchEnv, settings: Settings, ids: list[str], total: int, *, consumers: int,
              name: str, marks: Sequence[int] = (), timeout: float = 900.0) -> dict[str, Any]:
    """Project the topic with ``consumers`` projector processes in one group into a fresh prefix."""
    s = settings.with_(redis_prefix=f"{settings.redis_prefix}.{name}")
    kids = [env.start_projector(s, name) for _ in range(consumers)]
    try:
        res = _watch(env, s.redis_prefix, ids, total, [k.pid or 0 for k in kids], list(marks), timeout)
    finally:
        for k in kids:
            env.stop(k)
        env.delete_keys(s.redis_prefix + ":")
    res["consumers"] = consumers
    return res


class RawProjector:
    """The baseline: fastavro decode, then the same Lua per run per batch through one pipeline, on
    records consumed by a plain consumer in batches (:func:`consume_and_apply`; on a
    Redis Cluster, whose pipelines refuse ``evalsha``, the store's own apply: the same scripts,
    pipelined per node)."""

    def __init__(self, env: BenchEnv, prefix: str, templates: dict[str, RunState]) -> None:
        self.schema = fastavro.parse_schema(_plain_schema(load_schema("runlog.RunEvent")), named_schemas={})
        self.store = RedisStore(env.redis, prefix)
        self.sha = "" if self.store.cluster else str(env.redis.script_load(apply_script()))
        self.templates = templates
        self.offsets: dict[str, int] = {}

    def apply(self, batch: list[tuple[int, int, bytes, bytes]]) -> None:
        last: dict[str, tuple[int, int, int]] = {}
        for p, o, _k, v in batch:
            rec = fastavro.schemaless_reader(io.BytesIO(avro_body(v)), self.schema, None)
            assert isinstance(rec, dict)
            last[rec["run_id"]] = (p, o, rec["seq"])
        updates = []
        for run, (p, o, seq) in last.items():
            st = replace(self.templates[run], last_seq=seq, partition=p, offset=o)
            base = self.offsets.get(run, -1)  # the calls written already are the template's: none changed
            updates.append(RunUpdate(st, base, RunStatus.RUNNING, base_calls=st.calls if base >= 0 else None))
            self.offsets[run] = o
        if self.store.cluster:
            self.store.apply(updates)
            return
        args = [self.store.script_args(u) for u in updates]
        for attempt in (1, 2):
            pipe = self.store.client.pipeline(transaction=False)
            for keys, argv in args:
                pipe.evalsha(self.sha, len(keys), *keys, *argv)
            try:
                pipe.execute()
                return
            except redis.exceptions.NoScriptError:  # the script cache was flushed: load it again, once
                if attempt == 2:
                    raise
                self.sha = str(self.store.client.script_load(apply_script()))


def consume_and_apply(settings: Settings, topic: str, rp: RawProjector, *, batch: int,
                      idle_limit: int = 30) -> tuple[int, float]:
    """The projector baseline's own consumption: a plain consumer assigned every partition from the
    beginning, ``consume`` in batches of up to ``batch`` records, each batch decoded and applied
    (:meth:`RawProjector.apply`) before the next is asked for, until every partition's end offset
    (taken before) is reached. Returns (records applied, seconds from the first batch received to
    the last applied), the span the projector's own rate is measured over."""
    c = Consumer(settings.consumer_config("bench-raw-projector", **{"enable.partition.eof": False}))
    n = 0
    t_first: float | None = None
    try:
        ends = end_offsets(c, topic)
        todo = {p for p, e in ends.items() if e > 0}
        c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in todo])
        idle = 0
        while todo and idle < idle_limit:
            msgs = c.consume(num_messages=batch, timeout=1.0)
            idle = 0 if msgs else idle + 1
            if not msgs:
                continue
            if t_first is None:
                t_first = time.perf_counter()
            recs = []
            for m in msgs:
                if m.error() is not None:
                    continue
                p, o = m.partition(), m.offset()
                recs.append((p, o, m.key(), m.value()))
                if o >= ends[p] - 1:
                    todo.discard(p)
            rp.apply(recs)
            n += len(recs)
    finally:
        c.close()
    return n, max(time.perf_counter() - (t_first or time.perf_counter()), 1e-6)


def bench_projector(env: BenchEnv, *, events: int, runs: int, rounds: int, marks: list[int],
                    tick: Tick) -> tuple[dict[str, Any], Settings, list[str]]:
    """Events/s of ``runlog project`` vs decode + the same Lua, and the projector's peak RSS."""
    settings = env.settings("proj")
    ids = populate(env, settings, events=events, runs=runs, tag="p")
    tick("projector: topic written")
    ours: list[dict[str, Any]] = []
    for rnd in range(rounds):
        ours.append(run_group(env, settings, ids, events, consumers=1, name=f"r{rnd}",
                              marks=marks if rnd == 0 else []))
        tick(f"projector round {rnd + 1}")
    templates = {}
    for r in ids:
        st = fold_all(history(r, 1, min(events // runs, 250)))
        assert st is not None
        templates[r] = st
    theirs: list[float] = []
    for rnd in range(rounds):
        prefix = f"{settings.redis_prefix}.raw{rnd}"
        rp = RawProjector(env, prefix, templates)
        n, secs = consume_and_apply(settings, Topics.of(settings).events, rp, batch=500)
        if n != events:
            raise RunlogError(f"bench: the raw projector consumed {n} of {events} events")
        theirs.append(n / secs)
        env.delete_keys(prefix + ":")
        tick(f"projector baseline round {rnd + 1}")
    stream = bench_stream_ceiling(env, settings, events, rounds=rounds, tick=tick)
    fetches = bench_stream_ceiling(env, settings, events, rounds=rounds, tick=tick, batches=True)
    a = median([o["events_per_s"] for o in ours])
    b = median(theirs)
    return ({"projector_ratio": ratio(a, b), "runlog_events_per_s": a, "raw_events_per_s": b,
             "faust_stream_events_per_s": median(stream), "faust_stream_rounds": stream,
             "projector_of_faust_stream": ratio(a, median(stream)),
             "faust_batches_events_per_s": median(fetches), "faust_batches_rounds": fetches,
             "projector_of_faust_batches": ratio(a, median(fetches)),
             "runlog_rounds": [o["events_per_s"] for o in ours], "raw_rounds": theirs, "events": events,
             "runs": runs, "peak_rss_kib_at_events": ours[0]["peak_rss_kib_at"]}, settings, ids)


def measure_capacity(env: BenchEnv, *, events: int, runs: int, tick: Tick) -> dict[str, Any]:
    """The projector's capacity: events/s one ``runlog project`` sustains draining a backlog of
    ``events`` (what the projector section measures as ``runlog_events_per_s``, one round)."""
    settings = env.settings("cap")
    ids = populate(env, settings, events=events, runs=runs, tag="c")
    tick("capacity: topic written")
    res = run_group(env, settings, ids, events, consumers=1, name="cap")
    tick("capacity: projected")
    return {"events_per_s": res["events_per_s"], "source": "lag section", "events": events}


def bench_lag(env: BenchEnv, *, rate: int, seconds: float, runs: int, within: float,
              tick: Tick, name: str | None = None, projector: dict[str, Any] | None = None) -> dict[str, Any]:
    """Broker ack to visible in Redis, at a steady offered load, with the real projector running.

    ``name``: the point's own namespace (topics, Redis prefix, projector group; default from
    ``within``): two points must not share one, or the second's runs would continue the first's.
    ``projector``: more :class:`~runlog.processors.projector.ProjectorOptions` of the projector."""
    name = name or f"lag{int(within * 1000)}"
    settings = env.settings(name)
    kid = env.start_projector(settings, name, within=within, **(projector or {}))
    ids = [f"run-l-{r:04d}" for r in range(runs)]
    writer = RunWriter(settings)
    acks: dict[tuple[str, int], float] = {}
    seen: dict[tuple[str, int], float] = {}
    seq = dict.fromkeys(ids, 0)
    lock = threading.Lock()

    def send(run: str) -> None:
        seq[run] += 1
        s = seq[run]
        ev = next(history(run, s, s))

        def cb(err: object, _p: int, _o: int) -> None:
            if err is None:
                t = time.time()
                with lock:
                    acks[(run, s)] = t

        writer.produce(ev, cb)

    stop = threading.Event()
    shown = dict.fromkeys(ids, 0)

    def poll() -> None:
        while not stop.is_set():
            vals = env.last_seqs(settings.redis_prefix, ids)
            now = time.time()
            for r, v in zip(ids, vals, strict=True):
                for k in range(shown[r] + 1, v + 1):
                    seen[(r, k)] = now
                shown[r] = max(shown[r], v)
            time.sleep(0.002)

    switch = sys.getswitchinterval()
    # the bench's threads (the writer's delivery reports timing the acks, the poller timing the
    # visibility, the sender) hand the GIL over within 0.5 ms instead of 5: a timestamp is taken
    # when its event happened, not when the thread next got the interpreter
    sys.setswitchinterval(0.0005)
    try:
        for r in ids:  # warm-up: the projector has joined its group once these are visible
            send(r)
        if not env.wait_until(lambda: min(env.last_seqs(settings.redis_prefix, ids)) >= 1, 120, 0.1):
            raise RunlogError("bench: the projector did not start within 120s")
        poller = threading.Thread(target=poll, daemon=True)
        poller.start()
        tick("lag: projector ready")
        # one send per tick at most every 5 ms; below 200 ev/s, one send per 1/rate (a point at 20% of
        # a slow host's capacity must not be offered the 200/s of one send per tick)
        interval = 0.005 if rate >= 200 else 1.0 / rate
        per_tick = max(1, round(rate * interval))
        start = time.perf_counter()
        n = 0
        k = 0
        while time.perf_counter() - start < seconds:
            for _ in range(per_tick):
                send(ids[n % runs])
                n += 1
            k += 1
            delay = start + k * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        offered = n / (time.perf_counter() - start)
        rss = peak_rss_kib(kid.pid) if kid.pid else -1
        env.wait_until(lambda: all(shown[r] >= seq[r] for r in ids), 60, 0.05)
        stop.set()
        poller.join(5)
    finally:
        sys.setswitchinterval(switch)
        stop.set()
        writer.close()
        env.stop(kid)
    lags = [max(seen[k] - t, 0.0) * 1000 for k, t in acks.items() if k in seen and k[1] > 1]
    tick(f"lag at within={within}")
    return {"lag_p50_ms": percentile(lags, 50), "lag_p99_ms": percentile(lags, 99),
            "lag_max_ms": max(lags) if lags else float("nan"), "offered_events_per_s": offered,
            "target_events_per_s": rate,
            "events": len(lags), "runs": runs, "projector_within_s": within,
            "projector_peak_rss_kib": rss}


def bench_rebuild(env: BenchEnv, settings: Settings, *, rounds: int, tick: Tick) -> dict[str, Any]:
    """Events/s of ``runlog.projections.rebuild`` vs raw consume + fastavro decode of the same topic."""
    topic = Topics.of(settings).events
    schema = fastavro.parse_schema(_plain_schema(load_schema("runlog.RunEvent")), named_schemas={})
    ours: list[float] = []
    theirs: list[float] = []
    n = 0
    for rnd in range(rounds):
        target = f"{settings.redis_prefix}.rebuild{rnd}"
        rep = rebuild(settings, target, progress=None, client=env.redis)
        ours.append(rep.records / rep.seconds)
        env.delete_keys(target + ":")
        tick(f"rebuild round {rnd + 1}")
        t0 = time.perf_counter()
        recs = _fetch(settings, topic)
        for _p, _o, _k, v in recs:
            fastavro.schemaless_reader(io.BytesIO(avro_body(v)), schema, None)
        theirs.append(len(recs) / (time.perf_counter() - t0))
        n = len(recs)
        tick(f"rebuild baseline round {rnd + 1}")
    a, b = median(ours), median(theirs)
    return {"rebuild_ratio": ratio(a, b), "runlog_events_per_s": a, "raw_events_per_s": b,
            "runlog_rounds": ours, "raw_rounds": theirs, "events": n}
