"""``runlog project``: the Faust app folding the events topic into Redis and the compacted topics.

Delivery semantics: at-least-once in, idempotent apply. The agent takes a batch,
folds it (:class:`runlog.projections.BatchProjector`, a plain function of the batch),
produces the checkpoints (key run id) and effects (key delivery key) of each
update and waits for their acknowledgements, then writes Redis through the
offset-guarded Lua script, then produces dead letters; only then can the batch's
offsets be committed. A crash anywhere replays from the last commit: Redis ignores
what it already holds, and what Redis holds was published before it was written
(a crash between the two publishes identical records again). A Redis that lost the
namespace (emptied while the projector runs, or while it was down with offsets
committed) is rebuilt from the log before the projector goes on
(:mod:`runlog.projections.recovery`). Instances sharing the app id
form one consumer group and split the partitions.

Tracing (``RUNLOG_TRACING``, :mod:`runlog.processors._tracing`): each batch is a span ``runlog.project``
(kind consumer) linked to the distinct trace contexts its records carry (``traceparent`` headers).

The app is built here (:func:`build_app`); its state and callbacks are the fields and methods of a
:class:`~runlog.processors.projector._projector.Projector`, which needs no Faust app. Faust's Kafka
client is aiokafka, not librdkafka, so the security settings (``RUNLOG_KAFKA_*``) are translated for
it in :mod:`runlog.processors.projector._security`, with the setting lists in ``_keys``, the TLS
context in ``_tls`` and OAUTHBEARER in ``_oidc``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Any

import faust

from runlog.processors._startup import Stopped, wait_for_services
from runlog.processors._tracing import Tracing
from runlog.processors.metrics import MetricsServer, ProjectorMetrics
from runlog.processors.projector._auth import check_credentials
from runlog.processors.projector._batches import BatchDelivery, install
from runlog.processors.projector._offsets import LogGaps, OffsetGuard, kafka_committed
from runlog.processors.projector._preflight import check_kafka, check_redis
from runlog.processors.projector._projector import Outputs, Projector, RedisNamespace
from runlog.projections.batch import BatchProjector, BatchResult
from runlog.projections.redis_store import RedisStore
from runlog.schemas import Codec
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["ProjectorOptions", "build_app", "faust_credentials", "faust_settings", "observe", "run_projector"]

@dataclass(frozen=True, kw_only=True)
class ProjectorOptions:
    app_id: str = "runlog-projector"
    """Faust app id, also the consumer group id."""
    batch_size: int = 500
    within: float = 0.0
    """Seconds to wait for more records when fewer than ``batch_size`` have arrived (0: apply what
    has arrived; under load a batch fills while the one before is applied)."""
    cache_size: int = 10_000
    """Run states kept in memory (LRU); misses load from Redis."""
    lag_every: float = 5.0
    session_timeout_ms: int = 30_000
    """The group's session timeout: a member silent this long loses its partitions; heartbeats are
    sent every third of it."""
    inline_records: int = 64
    """Batches of at most this many records are folded and written on the event loop, without the
    hand-off to the worker thread and back (the latency floor at low load); bigger batches, and
    those that publish checkpoints or effects, go to the worker. 0: every batch on the worker."""
    fetch_min_bytes: int = 65_536
    """The fewest bytes of records a fetch of the events topic waits for at the broker (aiokafka's
    ``fetch_min_bytes``; its default, 1, answers every fetch as soon as one record is there)."""
    fetch_wait_ms: int = 10
    """The longest a fetch waits at the broker for ``fetch_min_bytes`` (``fetch_max_wait_ms``): what a
    record may wait at the broker when fewer bytes arrive, e.g. at rest, where the member then sends a
    fetch every ``fetch_wait_ms`` to each broker leading its partitions. Measured on a 2-core host at a
    fifth of the projector's capacity, 65,536 bytes and 10 ms halved the lag (p50 and p99) against 1 byte
    (docs/performance.md, "Fetch sizes at low load")."""
    switch_interval_s: float | None = 0.0005
    """The interpreter's thread switch interval in the projector's process (``sys.setswitchinterval``;
    Python's default is 5 ms): how long a thread woken by I/O (the consumer's, the worker's) may
    wait for the one holding the GIL. None: Python's default."""
    instance_id: str | None = None
    """Static membership (``group.instance.id``): a member restarted with the same id within the
    session timeout keeps its partitions without a rebalance. None: dynamic membership."""


def faust_credentials(settings: Settings) -> Any:
    """The librdkafka security settings (``RUNLOG_KAFKA_*``) as Faust broker credentials.

    Every security setting the other clients get is translated for aiokafka (TLS trust from a
    file, a directory or inline PEM, CRLs, client certificates and key passwords, host name
    verification, SASL PLAIN / SCRAM / OAUTHBEARER-OIDC); None for PLAINTEXT. A setting it
    cannot honour raises :class:`~runlog.schemas.errors.ConfigError` naming it, so the projector never
    connects differently from the other clients (:mod:`runlog.processors.projector._security`).
    """
    from runlog.processors.projector._security import broker_credentials

    return broker_credentials(settings.kafka_extra)


def faust_settings(settings: Settings, opts: ProjectorOptions) -> dict[str, Any]:
    """Faust settings that work against a Kafka 4 broker with auto topic creation off."""
    creds = faust_credentials(settings)
    return {
        **({"broker_credentials": creds} if creds is not None else {}),
        "broker": [f"kafka://{h.strip()}" for h in settings.kafka_bootstrap_servers.split(",")],
        "store": "memory://",
        # no local tables: keep Faust's data directory out of the working directory
        "datadir": os.path.join(tempfile.gettempdir(), "runlog-faust-{conf.name}"),
        "value_serializer": "raw",
        "key_serializer": "raw",
        "web_enabled": False,
        "topic_disable_leader": True,
        "topic_allow_declare": False,
        "consumer_auto_offset_reset": "earliest",
        "producer_acks": -1,
        "autodiscover": False,
        "stream_wait_empty": False,
        "broker_commit_every": 1000,
        "broker_commit_interval": 1.0,
        # aiokafka then fills a poll from one partition before the next, so a batch touches few
        # runs (one apply per run touched): 1.4x the events/s of the default round-robin mix.
        "broker_max_poll_records": 5000,
        "broker_session_timeout": opts.session_timeout_ms / 1000,
        "broker_heartbeat_interval": opts.session_timeout_ms / 3000,
        **({"consumer_group_instance_id": opts.instance_id} if opts.instance_id else {}),
    }


def observe(metrics: ProjectorMetrics, res: BatchResult, records: int, seconds: float | None = None) -> None:
    """Count one batch's outcomes (``seconds``: its fold and Redis write)."""
    metrics.observe_batch(res, records, seconds)


def build_app(settings: Settings, opts: ProjectorOptions | None = None,
              metrics: ProjectorMetrics | None = None, tracer_provider: Any = None) -> faust.App:
    """The projector app (not started); it counts into ``metrics`` (a private registry when None) and
    traces into ``tracer_provider`` (None: the global provider).

    The app's callbacks are the methods of one :class:`~runlog.processors.projector._projector.Projector`,
    which holds the member's state; this makes its parts and connects them."""
    o = opts or ProjectorOptions()
    m = metrics if metrics is not None else ProjectorMetrics()
    app = faust.App(settings.group_id(o.app_id), **faust_settings(settings, o))  # app id = group id
    names = Topics.of(settings)
    delivery = BatchDelivery(names.events, max_pending=max(4 * o.batch_size, 5000))
    # whole fetches to the agent, below Faust's per-record stream
    install(app, [delivery], fetch_min_bytes=o.fetch_min_bytes, fetch_wait_ms=o.fetch_wait_ms)
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes,
                           "key_serializer": "raw", "value_serializer": "raw"}
    events = app.topic(names.events, **raw)
    app.topics.add(events.clone(is_iterator=True))  # subscribed; acknowledged records are committed
    outputs = Outputs(checkpoints=app.topic(names.checkpoints, **raw),
                      effects=app.topic(names.effects, **raw), dlq=app.topic(names.dlq, **raw),
                      consumer=lambda: app.consumer)
    store = RedisStore.from_settings(settings)
    core = BatchProjector(store, Codec.from_settings(settings), cache_size=o.cache_size)
    committed, close_committed = kafka_committed(settings, settings.group_id(o.app_id), names.events)
    gaps = LogGaps(settings, names.events)
    core.heal = gaps.run  # a run whose state has a seq gap is re-folded from its partition
    namespace = RedisNamespace(settings, store, core, app_id=o.app_id, topic=names.events,
                               committed=committed)
    member = Projector(settings, group=settings.group_id(o.app_id), batch_size=o.batch_size, within=o.within,
                       core=core, guard=OffsetGuard(committed, gaps.range), delivery=delivery,
                       namespace=namespace, outputs=outputs, metrics=m,
                       tracing=Tracing(settings, tracer_provider), closers=(close_committed, gaps.close),
                       inline_records=o.inline_records)
    app.on_partitions_revoked.connect(member.on_revoked)
    app.on_partitions_assigned.connect(member.on_assigned)
    app.on_before_shutdown.connect(member.close_clients)
    app.agent(events, name="project")(member.project)
    app.timer(o.lag_every)(member.lag)
    app.timer(1.0)(member.replay_done)
    return app


def run_projector(settings: Settings, opts: ProjectorOptions | None = None) -> int:
    """Run the projector until it is stopped (SIGINT/SIGTERM); returns an exit code."""
    o = opts or ProjectorOptions()
    metrics = ProjectorMetrics()
    server = MetricsServer(metrics.registry, settings.metrics_port, settings.metrics_host) \
        if settings.metrics_port else None
    try:
        # a redis:// URL to a cluster node, an untrusted TLS server, refused credentials, no topics
        # (before init), no group ACL: one line each; Redis or Kafka not answering yet: waited for
        try:
            wait_for_services([lambda: check_redis(settings), lambda: check_credentials(settings),
                               lambda: check_kafka(settings, settings.group_id(o.app_id))],
                              who="runlog project", wait_ms=settings.startup_wait_ms)
        except Stopped:  # SIGTERM before it joined its group: nothing to finish
            return 0
        app = build_app(settings, o, metrics)
        if o.switch_interval_s is not None:
            sys.setswitchinterval(o.switch_interval_s)
        worker = faust.Worker(app, loglevel="WARNING", quiet=True, redirect_stdouts=False)
        if not sys.stdout.isatty():
            worker.spinner = None  # its cursor escapes would be all a log file gets
        print(f"runlog project: starting: group {settings.group_id(o.app_id)} on "
              f"{Topics.of(settings).events}", file=sys.stderr, flush=True)
        worker.execute_from_commandline()
    finally:
        if server is not None:
            server.close()
    return 0
