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
from typing import Any

import redis
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from runlog.processors.admin import ServiceUnavailable, ensure_topics
from runlog.processors.projector import ProjectorOptions, run_projector
from runlog.schemas import Codec, RunEvent
from runlog.schemas.errors import ConfigError, RunlogError
from runlog.schemas.internal import redis_client, watermarks
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics, TopicSpec

__all__ = ["BenchEnv", "end_offsets", "kafka_replication", "peak_rss_kib", "raw_topic_spec",
           "replication_mismatch", "rss_kib"]


def end_offsets(consumer: Consumer, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """Each partition's high watermark of ``topic`` (:func:`runlog.schemas._kafka.watermarks`, which asks
    again while a leader is not there yet: a topic the bench just created, a leader moving)."""
    return {p: high for p, (_, high) in watermarks(consumer, topic, timeout=timeout).items()}


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


def raw_topic_spec(settings: Settings, suffix: str) -> TopicSpec:
    """A baseline's topic ``<prefix><suffix>``: the events topic's spec (partitions, replication factor,
    ``min.insync.replicas``, retention) under another name, so the raw client writes to a topic
    replicated exactly like Runlog's."""
    events = Topics.of(settings).events
    spec = next(t for t in Topics.of(settings).specs(settings) if t.name == events)
    return TopicSpec(f"{settings.topic_prefix}{suffix}", spec.partitions, spec.replication_factor,
                     dict(spec.config))


def kafka_replication(settings: Settings, timeout: float = 10.0) -> dict[str, Any]:
    """How many brokers answer at ``settings``' bootstrap servers, the replication the bench's topics
    get (from settings), and the brokers' own defaults (None when they cannot be described)."""
    admin = AdminClient(settings.admin_config())
    try:
        md = admin.list_topics(timeout=timeout)
    except KafkaException as err:
        raise ServiceUnavailable(f"bench: Kafka at {settings.kafka_bootstrap_servers} did not answer: "
                                 f"{err}") from err
    out: dict[str, Any] = {"bootstrap_servers": settings.kafka_bootstrap_servers, "brokers": len(md.brokers),
                           "replication_factor": settings.replication_factor,
                           "min_insync_replicas": settings.min_insync_replicas,
                           "broker_default_replication_factor": None, "broker_min_insync_replicas": None}
    if md.brokers:
        res = ConfigResource(ResourceType.BROKER, str(min(md.brokers)))
        with contextlib.suppress(KafkaException, ValueError, KeyError):  # not allowed to describe: no check
            cfg = admin.describe_configs([res])[res].result(timeout)
            out["broker_default_replication_factor"] = int(cfg["default.replication.factor"].value)
            out["broker_min_insync_replicas"] = int(cfg["min.insync.replicas"].value)
    return out


def replication_mismatch(info: dict[str, Any]) -> str | None:
    """Why the configured replication is weaker than what the brokers give topics by default (a bench
    on a replicated cluster with ``RUNLOG_REPLICATION_FACTOR=1`` would measure unreplicated writes),
    or None."""
    rf, isr = info["replication_factor"], info["min_insync_replicas"]
    want_rf, want_isr = info["broker_default_replication_factor"], info["broker_min_insync_replicas"]
    if want_rf is None or want_isr is None or (rf >= want_rf and isr >= want_isr):
        return None
    return (f"the brokers at {info['bootstrap_servers']} give topics replication factor {want_rf} and "
            f"min.insync.replicas {want_isr}, but the bench would create its topics with {rf} and {isr}: "
            f"set RUNLOG_REPLICATION_FACTOR={max(rf, want_rf)} "
            f"RUNLOG_MIN_INSYNC_REPLICAS={max(isr, want_isr)}")


def _projector_main(settings: Settings, opts: ProjectorOptions, workdir: str) -> None:
    os.chdir(workdir)  # faust keeps its (empty) data directory in the working directory
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # faust's terminal output must not mix into the bench's JSON
    os.dup2(devnull, 2)
    run_projector(settings, opts)


_LAST_SEQS = """
local out = {}
for i, k in ipairs(KEYS) do
  out[i] = redis.call('HGET', k, 'last_seq') or false
end
return out
"""


class BenchEnv:
    """Namespaces, clients and child processes of one bench run; :meth:`close` removes them all."""

    def __init__(self, base: Settings) -> None:
        self.codec = Codec.from_settings(base)  # first: a registry that does not answer leaves nothing behind
        self.tag = uuid.uuid4().hex[:8]
        self.workdir = tempfile.mkdtemp(prefix=f"runlog-bench-{self.tag}-")
        self.base = base.with_(metrics_port=0, sweep_interval_ms=0,
                               artifact_root=os.path.join(self.workdir, "artifacts"))
        self.redis = redis_client(base)
        self._cluster = not isinstance(self.redis, redis.Redis)
        # a registered script loads itself again where the server lost it (a restart, SCRIPT FLUSH)
        self._last_seqs = self.redis.register_script(_LAST_SEQS) if not self._cluster else None
        self._topics: list[str] = []
        self._children: list[BaseProcess] = []
        self._ctx = mp.get_context("spawn")

    def settings(self, name: str, *, topics: bool = True, partitions: int | None = None) -> Settings:
        """Settings of a private namespace ``name`` (topics created unless ``topics`` is false).

        The topics are Runlog's own (:func:`runlog.processors.admin.ensure_topics`): replication factor and
        ``min.insync.replicas`` from the base settings (``RUNLOG_REPLICATION_FACTOR``,
        ``RUNLOG_MIN_INSYNC_REPLICAS``).

        Raises:
            ConfigError: the broker refused a topic (e.g. a replication factor above its broker count),
                or a topic of that name exists with another configuration.
        """
        s = self.base.with_(topic_prefix=f"bench-{self.tag}-{name}.", redis_prefix=f"bench-{self.tag}-{name}",
                            partitions=partitions or self.base.partitions)
        if topics:
            self._topics.extend(spec.name for spec in Topics.of(s).specs(s))  # every topic init creates
            bad = [r for r in ensure_topics(s) if r.action not in ("created", "ok")]
            if bad:
                raise ConfigError(f"bench: topic {bad[0].name} is {bad[0].action}: "
                                  + "; ".join(str(c) for c in bad[0].conflicts))
        return s

    def raw_topic(self, settings: Settings, suffix: str) -> str:
        """A second events-like topic for a baseline to write to (:func:`raw_topic_spec`)."""
        spec = raw_topic_spec(settings, suffix)
        admin = AdminClient(settings.admin_config())
        fut = admin.create_topics([NewTopic(spec.name, num_partitions=spec.partitions,
                                            replication_factor=spec.replication_factor,
                                            config=dict(spec.config))], operation_timeout=30)
        self._topics.append(spec.name)
        try:
            fut[spec.name].result(30)
        except KafkaException as err:
            kerr = err.args[0] if err.args else None
            if isinstance(kerr, KafkaError) and kerr.code() in (KafkaError.INVALID_REPLICATION_FACTOR,
                                                                KafkaError.POLICY_VIOLATION,
                                                                KafkaError.INVALID_CONFIG):
                raise ConfigError(f"bench: cannot create topic {spec.name!r}: {kerr.str()}") from err
            raise
        return spec.name

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
                        within: float | None = None, **options: Any) -> BaseProcess:
        """Start ``runlog project`` (:func:`runlog.processors.projector.run_projector`) in a child process.

        ``batch_size``, ``within`` and the other ``options`` (fields of
        :class:`~runlog.processors.projector.ProjectorOptions`) default to ``runlog project``'s own.
        """
        d = ProjectorOptions()
        o = ProjectorOptions(app_id=f"bench-{self.tag}-{app_id}",
                             batch_size=d.batch_size if batch_size is None else batch_size,
                             within=d.within if within is None else within, **options)
        return self.start_child(_projector_main, (settings, o, self.workdir))

    def start_child(self, target: Callable[..., None], args: tuple[Any, ...]) -> BaseProcess:
        """Start ``target(*args)`` in a spawned child process, stopped by :meth:`close` at the latest."""
        child = self._ctx.Process(target=target, args=args, daemon=True)
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
        """Each run's projected ``last_seq`` in Redis under ``prefix`` (0 when not there yet).

        On one Redis, one script call reads them all: the lag section asks every 2 ms, and a
        pipeline of one ``HGET`` per run cost the bench's own process (whose threads also time the
        acknowledgements) about a millisecond of CPU each time, on a host that may have two cores
        for the broker, Redis, the projector and the bench. A cluster gets the pipeline."""
        keys = [f"{prefix}:{{{r}}}:state" for r in run_ids]
        if not self._cluster:
            assert self._last_seqs is not None
            vals = self._last_seqs(keys=keys)
            return [int(v) if v else 0 for v in vals]
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
                self._delete_topics(self._topics)
            finally:
                self._topics = []
        self.delete_keys(f"bench-{self.tag}-")
        self.redis.close()
        shutil.rmtree(self.workdir, ignore_errors=True)

    def _delete_topics(self, topics: list[str], timeout: float = 60.0) -> None:
        """Delete ``topics`` and wait until the broker no longer lists them (a deletion is acknowledged
        by the controller before every broker's metadata drops the topic); asked again while some
        remain, so a deletion that timed out under load is not left behind."""
        admin = AdminClient(self.base.admin_config())
        deadline = time.monotonic() + timeout

        def remaining() -> list[str]:
            listed = admin.list_topics(timeout=10).topics
            return [t for t in topics if t in listed]

        left = list(topics)
        while left:
            for f in admin.delete_topics(left, operation_timeout=30).values():
                with contextlib.suppress(KafkaException):  # already gone, or asked again below
                    f.result(30)
            if self.wait_until(lambda: not remaining(), 10, 0.2):
                return
            left = remaining()
            if left and time.monotonic() >= deadline:
                raise RunlogError(f"bench: could not delete its topics {left}")

    @staticmethod
    def wait_until(cond: Callable[[], bool], timeout: float, step: float = 0.05) -> bool:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if cond():
                return True
            time.sleep(step)
        return False
