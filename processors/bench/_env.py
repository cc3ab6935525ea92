"""Isolation and plumbing for one bench run: private topics and Redis keys, the projector process, RSS.

Every namespace a run creates is named ``bench-<tag>-<name>`` (topics get that
prefix, Redis keys that first segment) and is deleted at the end, so a bench
run shares the broker and Redis with other users without touching their data.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from pathlib import Path

import redis
from confluent_kafka import KafkaException, Producer
from confluent_kafka.admin import AdminClient

from processors.admin import ensure_topics
from processors.projector import ProjectorOptions, run_projector
from schemas._codec import Codec
from schemas._types import RunEvent
from schemas.errors import RunlogError
from schemas.settings import Settings
from schemas.topics import Topics

__all__ = ["BenchEnv", "peak_rss_kib", "rss_kib"]


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        return -1
    return -1


def rss_kib(pid: int | None = None) -> int:
    """Resident set size of a process (this one by default), KiB; -1 when unknown."""
    return _status_kib(pid or os.getpid(), "VmRSS")


def peak_rss_kib(pid: int | None = None) -> int:
    """Peak resident set size (VmHWM) of a process, KiB; -1 when unknown."""
    return _status_kib(pid or os.getpid(), "VmHWM")


def _projector_main(settings: Settings, opts: ProjectorOptions, workdir: str) -> None:
    os.chdir(workdir)  # faust keeps its (empty) data directory in the working directory
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # faust's terminal output must not mix into the bench's JSON
    os.dup2(devnull, 2)
    run_projector(settings, opts)


class BenchEnv:
    """Namespaces, clients and child processes of one bench run; :meth:`close` removes them all."""

    def __init__(self, base: Settings) -> None:
        self.tag = uuid.uuid4().hex[:8]
        self.workdir = tempfile.mkdtemp(prefix=f"runlog-bench-{self.tag}-")
        self.base = base.with_(metrics_port=0, sweep_interval_ms=0,
                               artifact_root=os.path.join(self.workdir, "artifacts"))
        self.redis = redis.Redis.from_url(base.redis_url, **base.redis_kwargs())
        self._topics: list[str] = []
        self._children: list[BaseProcess] = []
        self._ctx = mp.get_context("spawn")
        self.codec = Codec(max_record_bytes=base.max_record_bytes)

    def settings(self, name: str, *, topics: bool = True, partitions: int | None = None) -> Settings:
        """Settings of a private namespace ``name`` (topics created unless ``topics`` is false)."""
        s = self.base.with_(topic_prefix=f"bench-{self.tag}-{name}.", redis_prefix=f"bench-{self.tag}-{name}",
                            partitions=partitions or self.base.partitions)
        if topics:
            ensure_topics(s)
            t = Topics.of(s)
            self._topics.extend([t.events, t.checkpoints, t.effects, t.resume, t.dlq])
        return s

    def raw_topic(self, settings: Settings, suffix: str) -> str:
        """A second events-like topic (same partitions) for a baseline to write to."""
        from confluent_kafka.admin import NewTopic

        name = f"{settings.topic_prefix}{suffix}"
        admin = AdminClient(settings.admin_config())
        fut = admin.create_topics(
            [NewTopic(name, num_partitions=settings.partitions,
                      replication_factor=settings.replication_factor)])
        fut[name].result(30)
        self._topics.append(name)
        return name

    def produce_events(self, settings: Settings, events: Sequence[RunEvent]) -> None:
        """Write events (already in the order wanted) to the events topic as fast as possible."""
        p = Producer(settings.producer_config())
        topic = Topics.of(settings).events
        failed: list[str] = []

        def cb(err: object, _msg: object) -> None:
            if err is not None:
                failed.append(str(err))

        for i, ev in enumerate(events):
            data = self.codec.encode(ev)
            while True:
                try:
                    p.produce(topic, value=data, key=ev.run_id.encode(), on_delivery=cb)
                    break
                except BufferError:
                    p.poll(0.05)
            if i % 1000 == 0:
                p.poll(0)
        if p.flush(120) or failed:
            raise RunlogError(f"bench: writing {len(events)} events failed: {failed[:1]}")

    def start_projector(self, settings: Settings, app_id: str, *, batch_size: int | None = None,
                        within: float | None = None) -> BaseProcess:
        """Start ``runlog project`` (:func:`processors.projector.run_projector`) in a child process.

        ``batch_size`` and ``within`` default to ``runlog project``'s own defaults.
        """
        d = ProjectorOptions()
        o = ProjectorOptions(app_id=f"bench-{self.tag}-{app_id}",
                             batch_size=d.batch_size if batch_size is None else batch_size,
                             within=d.within if within is None else within)
        child = self._ctx.Process(target=_projector_main, args=(settings, o, self.workdir), daemon=True)
        child.start()
        self._children.append(child)
        return child

    def stop(self, child: BaseProcess, timeout: float = 15.0) -> None:
        if child.is_alive():
            child.terminate()  # SIGTERM: faust shuts down cleanly
            child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join(5)

    def last_seqs(self, prefix: str, run_ids: Sequence[str]) -> list[int]:
        """Each run's projected ``last_seq`` in Redis under ``prefix`` (0 when not there yet)."""
        pipe = self.redis.pipeline(transaction=False)
        for r in run_ids:
            pipe.hget(f"{prefix}:{{{r}}}:state", "last_seq")
        return [int(v) if v is not None else 0 for v in pipe.execute()]

    def delete_keys(self, prefix: str) -> None:
        batch: list[bytes] = []
        for k in self.redis.scan_iter(match=f"{prefix}*", count=2000):
            batch.append(k)
            if len(batch) >= 1000:
                self.redis.delete(*batch)
                batch = []
        if batch:
            self.redis.delete(*batch)

    def close(self) -> None:
        """Stop children, delete every topic and Redis key of this run, remove the work directory."""
        for c in self._children:
            self.stop(c)
        if self._topics:
            try:
                admin = AdminClient(self.base.admin_config())
                futs = admin.delete_topics(self._topics, operation_timeout=30)
                for f in futs.values():
                    with contextlib.suppress(KafkaException):  # already gone
                        f.result(30)
            finally:
                self._topics = []
        self.delete_keys(f"bench-{self.tag}-")
        self.redis.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    @staticmethod
    def wait_until(cond: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return True
            time.sleep(step)
        return False
