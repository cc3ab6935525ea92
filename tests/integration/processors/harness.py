"""Helpers for projector tests: produce synthetic logs, run ``runlog project`` as a real process."""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import redis
from confluent_kafka import Producer

from runlog.projections import diff_namespaces, rebuild
from runlog.projections.log_reader import LogReader
from runlog.schemas import Codec, EventType, RunEvent, Settings, Topics

ROOT = Path(__file__).resolve().parents[3]
CODEC = Codec()


def produce(settings: Settings, items: Iterable[RunEvent | tuple[bytes | None, bytes]]) -> int:
    """Append events (or raw (key, bytes) records) in order with the writers' producer config."""
    p = Producer(settings.producer_config())
    topic = Topics.of(settings).events
    n = 0
    for it in items:
        key, value = (it.run_id.encode(), CODEC.encode(it)) if isinstance(it, RunEvent) else it
        while True:
            try:
                p.produce(topic, key=key, value=value)
                break
            except BufferError:  # the local queue is full: let deliveries drain it
                p.poll(0.5)
        n += 1
        if n % 5000 == 0:
            p.poll(0)
    assert p.flush(60) == 0
    return n


def interleave(runs: list[list[RunEvent]], seed: int = 7) -> list[RunEvent]:
    """One stream of many runs' events, each run's order kept."""
    rnd = random.Random(seed)
    cursors = [0] * len(runs)
    live = [i for i, r in enumerate(runs) if r]
    out = []
    while live:
        i = rnd.choice(live)
        out.append(runs[i][cursors[i]])
        cursors[i] += 1
        if cursors[i] == len(runs[i]):
            live.remove(i)
    return out


def garbage(n: int, seed: int = 3) -> list[tuple[bytes | None, bytes]]:
    rnd = random.Random(seed)
    good = CODEC.encode(RunEvent("g", 1, 1, EventType.RUN_STARTED, 1))
    kinds = [
        lambda: rnd.randbytes(rnd.randint(0, 40)).replace(b"\xc3", b"x"),   # unknown framing
        lambda: b"\xc3\x01" + rnd.randbytes(8) + b"body",                     # unknown schema
        lambda: good[: rnd.randint(10, len(good) - 1)],                      # truncated
    ]
    return [(f"junk-{i}".encode(), kinds[i % 3]()) for i in range(n)]


def env_of(settings: Settings, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update({
        "KAFKA_BOOTSTRAP_SERVERS": settings.kafka_bootstrap_servers,
        "REDIS_URL": settings.redis_url,
        "RUNLOG_TOPIC_PREFIX": settings.topic_prefix,
        "RUNLOG_REDIS_PREFIX": settings.redis_prefix,
        "RUNLOG_PARTITIONS": str(settings.partitions),
        "RUNLOG_METRICS_PORT": str(settings.metrics_port),
    })
    env.update(extra)
    return env


def start_projector(
    settings: Settings, app_id: str, *args: str, log: Path | None = None, **env: str
) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "runlog", "project", "--app-id", app_id, *args]
    if log is None:
        return subprocess.Popen(argv, cwd=ROOT, env=env_of(settings, **env),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with open(log, "ab") as err:
        return subprocess.Popen(argv, cwd=ROOT, env=env_of(settings, **env),
                                stdout=subprocess.DEVNULL, stderr=err)


def stop(proc: subprocess.Popen[bytes], sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listened on a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_until(cond: Callable[[], bool], timeout: float, every: float = 1.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(every)
    return cond()


def reference(settings: Settings, client: redis.Redis) -> str:
    """Rebuild the whole log into a reference namespace; returns its prefix."""
    target = f"{settings.redis_prefix}.ref"
    rebuild(settings, target, progress=None, client=client)
    return target


def converges(settings: Settings, client: redis.Redis, ref: str, timeout: float) -> list[str]:
    """Wait until the live namespace equals ``ref``; returns the keys still differing."""
    diff: list[str] = []

    def same() -> bool:
        nonlocal diff
        diff = diff_namespaces(client, settings.redis_prefix, ref)
        return not diff

    wait_until(same, timeout, every=2.0)
    return diff


def read_topic(settings: Settings, topic: str, timeout: float = 30.0) -> list[object]:
    """Every record of a topic (up to its high watermarks at call time)."""
    with LogReader(settings, topic, name="t-read", stall_s=timeout) as r:
        return list(r.records(r.topic_ranges()))
