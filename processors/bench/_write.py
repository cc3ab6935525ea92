"""Write-path benchmarks: Runlog's writer against fastavro + a raw confluent-kafka producer.

Delivery semantics: both sides use ``Settings.producer_config()`` unchanged
(idempotent, ``acks=all``, same linger, batch and compression); a round ends
when every record is acknowledged.
"""

from __future__ import annotations

import io
import time
from collections.abc import Callable
from typing import Any

import fastavro
from confluent_kafka import Producer

from runlog.processors.bench._env import BenchEnv, rss_kib
from runlog.processors.bench._events import event_fields, history, median, percentile, ratio
from runlog.producers import DictInputSource, Workflow
from runlog.producers.internal import PinnedInputs, RedisLeaseManager, RunSession, RunWriter
from runlog.schemas import SINGLE_OBJECT_MAGIC, EventType, ReplayPolicy, RunEvent, load_schema
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["avro_body", "bench_append", "bench_intent", "bench_writer_scale"]

Tick = Callable[[str], None]


def _plain_schema(node: Any) -> Any:
    """The bundled schema without logical types (the codec writes timestamps as plain longs too)."""
    if isinstance(node, list):
        return [_plain_schema(n) for n in node]
    if isinstance(node, dict):
        if "logicalType" in node and node.get("type") in ("long", "int"):
            return node["type"]
        return {k: _plain_schema(v) for k, v in node.items() if k != "logicalType"}
    return node


def avro_body(data: bytes) -> bytes:
    """The Avro body of a record in either framing the codec writes: the Schema Registry wire format
    (``0x00`` and a 4-byte schema id, with ``RUNLOG_SCHEMA_REGISTRY_URL``) or single-object (2-byte
    magic and an 8-byte fingerprint)."""
    return data[5:] if data[:1] == b"\x00" else data[10:]


class RawWriter:
    """The baseline: fastavro ``schemaless_writer`` into a reused buffer, then ``Producer.produce``."""

    def __init__(self, env: BenchEnv, settings: Settings, topic: str) -> None:
        self.schema = fastavro.parse_schema(_plain_schema(load_schema("runlog.RunEvent")), named_schemas={})
        self.header = SINGLE_OBJECT_MAGIC + env.codec.fingerprint("runlog.RunEvent")
        self.producer = Producer(settings.producer_config())
        self.topic = topic
        self.errors = 0
        self._buf = io.BytesIO()

    def as_record(self, event: RunEvent) -> dict[str, Any]:
        """The Avro dict of an event, read back from Runlog's own encoding (identical bytes)."""
        from runlog.schemas import Codec

        data = Codec().encode(event)
        rec = fastavro.schemaless_reader(io.BytesIO(data[10:]), self.schema, None)
        assert isinstance(rec, dict)
        return rec

    def _cb(self, err: object, _msg: object) -> None:
        if err is not None:
            self.errors += 1

    def produce(self, record: dict[str, Any], key: bytes) -> None:
        b = self._buf
        b.seek(0)
        b.truncate()
        b.write(self.header)
        fastavro.schemaless_writer(b, self.schema, record)
        while True:
            try:
                self.producer.produce(self.topic, value=b.getvalue(), key=key, on_delivery=self._cb)
                return
            except BufferError:
                self.producer.poll(0.01)


def _sessions(settings: Settings, writer: RunWriter, leases: RedisLeaseManager, n: int,
              tag: str) -> list[RunSession]:
    wf = Workflow("bench", "1")
    inputs = PinnedInputs(DictInputSource({}), {})
    return [RunSession(writer, leases.acquire(f"run-{tag}-{i:05d}"), run_id=f"run-{tag}-{i:05d}", next_seq=1,
                       workflow=wf, inputs=inputs, params={}) for i in range(n)]


def bench_append(env: BenchEnv, *, events: int, runs: int, rounds: int, tick: Tick) -> dict[str, Any]:
    """Events/s of ``RunSession.append`` over many runs vs fastavro + a raw producer."""
    settings = env.settings("append")
    raw_topic = env.raw_topic(settings, "raw.events")
    per_run = events // runs
    fields = [event_fields(seq) for seq in range(1, per_run + 1)]
    writer = RunWriter(settings)
    leases = RedisLeaseManager(env.redis, settings)
    raw = RawWriter(env, settings, raw_topic)
    runlog_rates: list[float] = []
    raw_rates: list[float] = []
    try:
        for rnd in range(rounds):
            sessions = _sessions(settings, writer, leases, runs, f"a{rnd}")
            t0 = time.perf_counter()
            for i in range(per_run):
                t, f = fields[i]
                for s in sessions:
                    s.append(t, **f)
            for s in sessions:
                s.flush()
            runlog_rates.append(per_run * runs / (time.perf_counter() - t0))
            for s in sessions:
                s.close()
            tick(f"append runlog round {rnd + 1}")
            templates = [raw.as_record(e) for e in history("run-x", 1, per_run)]
            records = [({**tpl, "run_id": f"run-b{rnd}-{r:05d}", "occurred_at": time.time_ns() // 1_000_000},
                        f"run-b{rnd}-{r:05d}".encode()) for tpl in templates for r in range(runs)]
            t0 = time.perf_counter()
            for n, (rec, key) in enumerate(records):
                raw.produce(rec, key)
                if n % 1000 == 0:
                    raw.producer.poll(0)
            raw.producer.flush(120)
            raw_rates.append(len(records) / (time.perf_counter() - t0))
            tick(f"append raw round {rnd + 1}")
    finally:
        writer.close()
        leases.close()
    a, b = median(runlog_rates), median(raw_rates)
    return {"append_ratio": ratio(a, b), "runlog_events_per_s": a, "raw_events_per_s": b,
            "runlog_rounds": runlog_rates, "raw_rounds": raw_rates, "events_per_round": per_run * runs,
            "runs": runs, "raw_errors": raw.errors}


def bench_intent(env: BenchEnv, *, samples: int, rounds: int, tick: Tick) -> dict[str, Any]:
    """Latency of a confirmed ``EFFECT_INTENT`` append vs a raw produce + flush of one record."""
    settings = env.settings("intent")
    raw = RawWriter(env, settings, Topics.of(settings).events)
    writer = RunWriter(settings)
    leases = RedisLeaseManager(env.redis, settings)
    ours: list[float] = []
    theirs: list[float] = []
    p50s: list[tuple[float, float]] = []
    try:
        for rnd in range(rounds):
            s = _sessions(settings, writer, leases, 1, f"i{rnd}")[0]
            s.append(EventType.RUN_STARTED, confirm=True)
            rec = raw.as_record(next(history(f"run-j{rnd}", 2, 2)))
            key = f"run-j{rnd}".encode()
            a: list[float] = []
            b: list[float] = []
            for i in range(samples):
                t0 = time.perf_counter()
                s.append(EventType.EFFECT_INTENT, confirm=True, stage="work", tool="payments.charge",
                         call_id=f"work/payments.charge/{i}", delivery_key=f"{i:064x}", target="payments",
                         replay_policy=ReplayPolicy.NEVER)
                a.append((time.perf_counter() - t0) * 1000)
                t0 = time.perf_counter()
                raw.produce({**rec, "seq": i + 2}, key)
                raw.producer.flush(30)
                b.append((time.perf_counter() - t0) * 1000)
            s.close()
            ours += a
            theirs += b
            p50s.append((percentile(a, 50), percentile(b, 50)))
            tick(f"confirmed append round {rnd + 1}")
    finally:
        writer.close()
        leases.close()
    r50 = median([x for x, _ in p50s])
    b50 = median([y for _, y in p50s])
    return {"intent_latency_ratio": ratio(r50, b50), "runlog_p50_ms": r50,
            "runlog_p99_ms": percentile(ours, 99),
            "raw_p50_ms": b50, "raw_p99_ms": percentile(theirs, 99), "samples": len(ours),
            "linger_ms": settings.producer_config().get("linger.ms")}


def bench_writer_scale(env: BenchEnv, *, runs: int, events_per_run: int, tick: Tick) -> dict[str, Any]:
    """Many concurrent runs in one writer: events/s and resident memory per active run."""
    settings = env.settings("scale-w")
    writer = RunWriter(settings)
    leases = RedisLeaseManager(env.redis, settings)
    fields = [event_fields(seq) for seq in range(1, events_per_run + 1)]
    try:
        before = rss_kib()
        sessions = _sessions(settings, writer, leases, runs, "s")
        after_open = rss_kib()
        tick(f"scale: {runs} sessions open")
        t0 = time.perf_counter()
        for t, f in fields:
            for s in sessions:
                s.append(t, **f)
        for s in sessions:
            s.flush()
        secs = time.perf_counter() - t0
        after_write = rss_kib()
        for s in sessions:
            s.close()
        tick("scale: writer appended")
    finally:
        writer.close()
        leases.close()
    return {"runs": runs, "events": runs * events_per_run, "events_per_s": runs * events_per_run / secs,
            "kib_per_run_open": (after_open - before) / runs,
            "kib_per_run_after_writes": (after_write - before) / runs, "rss_kib": after_write}
