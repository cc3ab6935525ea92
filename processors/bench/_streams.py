"""Streams: token produced to subscriber, at a steady rate spread over many streaming runs.

Each run streams one model call's deltas through the stream writer (:mod:`runlog.producers.streams`, the
producer of its own a streaming request writes with). The subscriber is a relay: one
:class:`runlog.processors.streams.StreamReader` following every run from offset 0 on a thread, as a server
forwarding many runs' streams to their clients (the console's live view) does. A delta's latency is
the time from the writer producing it (``produced_ns``) to the relay holding the decoded record.
Also reported: what a delta costs the run that streams it (the time inside the writer's call, which
only enqueues), records dropped or not delivered, and the run's log beside it: confirmed appends of
run events (``EFFECT_INTENT``, the write a run waits for) timed on a thread of the same process for as
long as the streaming lasts, and for as long again before it (no streaming), p50 and p99 of each.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from runlog.processors.bench._env import BenchEnv
from runlog.processors.bench._events import percentile
from runlog.processors.bench._write import _sessions
from runlog.processors.streams import StreamReader
from runlog.producers.internal import RedisLeaseManager, RunWriter
from runlog.producers.streams import StreamWriter
from runlog.schemas import EventType, ReplayPolicy, StreamKind
from runlog.schemas.settings import Settings

__all__ = ["bench_streams"]

Tick = Callable[[str], None]


class _AppendProbe:
    """Confirmed appends of one run, timed on a thread until stopped, one every 10 ms."""

    def __init__(self, env: BenchEnv, settings: Settings, tag: str) -> None:
        self._writer = RunWriter(settings)
        self._leases = RedisLeaseManager(env.redis, settings)
        self._session = _sessions(settings, self._writer, self._leases, 1, tag)[0]
        self._session.append(EventType.RUN_STARTED, confirm=True)
        self._n = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.ms: list[float] = []

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._n += 1
            t0 = time.perf_counter()
            self._session.append(EventType.EFFECT_INTENT, confirm=True, stage="work", tool="payments.charge",
                                 call_id=f"work/payments.charge/{self._n}", delivery_key=f"{self._n:064x}",
                                 target="payments", replay_policy=ReplayPolicy.NEVER)
            self.ms.append((time.perf_counter() - t0) * 1000)
            self._stop.wait(0.01)

    def run_for(self, seconds: float) -> list[float]:
        """Time appends for ``seconds`` (this thread waits)."""
        self.start()
        time.sleep(seconds)
        return self.stop()

    def start(self) -> None:
        self.ms, self._stop = [], threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def stop(self) -> list[float]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(30)
        return list(self.ms)

    def close(self) -> None:
        self._session.close()
        self._writer.close()
        self._leases.close()


def bench_streams(env: BenchEnv, *, runs: int, rate: int, seconds: float, tick: Tick) -> dict[str, Any]:
    """``rate`` deltas per second in all, round-robin over ``runs`` runs, for ``seconds``."""
    settings = env.settings("streams")
    writer = StreamWriter.from_settings(settings)
    ids = [f"run-s-{r:04d}" for r in range(runs)]
    attempts = {r: writer.begin(run_id=r, stage="chat", call_id="chat/model/0", epoch=1, attempt=1,
                                supersedes=False) for r in ids}
    writer.flush(30)
    lat: list[float] = []
    got = dict.fromkeys(ids, 0)
    lock = threading.Lock()
    stop = threading.Event()
    reader = StreamReader(settings, runs=dict.fromkeys(ids, 0))

    def follow() -> None:
        while not stop.is_set():
            entries = reader.poll(0.1)
            now = time.time_ns()
            with lock:
                for e in entries:
                    if e.record is not None and e.record.kind is StreamKind.DELTA:
                        lat.append((now - e.record.produced_ns) / 1e6)
                        got[e.run_id] += 1

    thread = threading.Thread(target=follow, daemon=True)
    thread.start()
    probe = _AppendProbe(env, settings, "streams")
    idle = probe.run_for(seconds)
    tick("streams: subscribers started")
    cost: list[float] = []
    sent = 0
    try:
        time.sleep(2.0)  # the reader has their partitions assigned and fetched BEGIN
        with lock:
            lat.clear()
        interval = 0.005
        per_tick = max(1, int(rate * interval))
        start = time.perf_counter()
        k = 0
        probe.start()
        while time.perf_counter() - start < seconds:
            for _ in range(per_tick):
                t0 = time.perf_counter_ns()
                attempts[ids[sent % runs]].delta(0, "tok ")
                cost.append((time.perf_counter_ns() - t0) / 1000)
                sent += 1
            k += 1
            delay = start + k * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
        offered = sent / (time.perf_counter() - start)
        busy = probe.stop()
        writer.flush(30)
        env.wait_until(lambda: sum(got.values()) >= sent, 30, 0.05)
    finally:
        stop.set()
        thread.join(5)
        reader.close()
        probe.stop()
        probe.close()
    tick("streams: measured")
    with lock:
        received = sum(got.values())
        lats = list(lat)
    return {"stream_p50_ms": percentile(lats, 50), "stream_p99_ms": percentile(lats, 99),
            "stream_max_ms": max(lats) if lats else float("nan"), "offered_tokens_per_s": offered,
            "tokens": sent, "received": received, "runs": runs,
            "write_call_p50_us": percentile(cost, 50), "write_call_p99_us": percentile(cost, 99),
            "dropped": writer.dropped, "failed": writer.failed,
            "append_idle_p50_ms": percentile(idle, 50), "append_idle_p99_ms": percentile(idle, 99),
            "append_streaming_p50_ms": percentile(busy, 50), "append_streaming_p99_ms": percentile(busy, 99),
            "appends": len(idle) + len(busy)}
