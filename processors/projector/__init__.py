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

The app is this module. Faust's Kafka client is aiokafka, not librdkafka, so the security
settings (``RUNLOG_KAFKA_*``) are translated for it in :mod:`runlog.processors.projector._security`,
with the setting lists in ``_keys``, the TLS context in ``_tls`` and OAUTHBEARER in ``_oidc``.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import sys
import tempfile
import time
from collections.abc import Awaitable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

import faust

from runlog.processors._tracing import Tracing
from runlog.processors.dlq import to_record
from runlog.processors.metrics import MetricsServer, ProjectorMetrics
from runlog.processors.projector._auth import check_credentials
from runlog.processors.projector._batches import BatchDelivery, install
from runlog.processors.projector._offsets import LogGaps, OffsetGuard, kafka_committed
from runlog.projections import EffectEntry
from runlog.projections.batch import BatchProjector, BatchResult, RawRecord
from runlog.projections.recovery import lost_at_start, recover
from runlog.projections.redis_store import ProjectionLost, ProjectionStoreError, RedisStore
from runlog.projections.store import StoreWentBack
from runlog.schemas import Checkpoint, Codec
from runlog.schemas.internal import distinct_contexts
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["ProjectorOptions", "build_app", "faust_credentials", "faust_settings", "observe", "run_projector"]

log = logging.getLogger(__name__)

RECOVERY_ATTEMPTS = 3
PUBLISH_TIMEOUT_S = 120.0


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
    traces into ``tracer_provider`` (None: the global provider)."""
    o = opts or ProjectorOptions()
    m = metrics if metrics is not None else ProjectorMetrics()
    app = faust.App(settings.group_id(o.app_id), **faust_settings(settings, o))  # app id = group id
    names = Topics.of(settings)
    delivery = BatchDelivery(names.events, max_pending=max(4 * o.batch_size, 5000))
    install(app, [delivery])  # whole fetches to the agent, below Faust's per-record stream
    raw: dict[str, Any] = {"key_type": bytes, "value_type": bytes,
                           "key_serializer": "raw", "value_serializer": "raw"}
    events = app.topic(names.events, **raw)
    app.topics.add(events.clone(is_iterator=True))  # subscribed; acknowledged records are committed
    checkpoints = app.topic(names.checkpoints, **raw)
    effects = app.topic(names.effects, **raw)
    dlq = app.topic(names.dlq, **raw)
    codec = Codec.from_settings(settings)
    store = RedisStore.from_settings(settings)
    core = BatchProjector(store, codec, cache_size=o.cache_size)
    worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="project")
    done: dict[int, int] = {}
    app_loop: list[asyncio.AbstractEventLoop] = []
    committed, close_committed = kafka_committed(settings, settings.group_id(o.app_id), names.events)
    gaps = LogGaps(settings, names.events)
    guard = OffsetGuard(committed, gaps.range)
    core.heal = gaps.run  # a run whose state has a seq gap is re-folded from its partition
    rebalanced = [False]  # set on the loop, read by the worker: drop the cached run states
    tracing = Tracing(settings, tracer_provider)

    def on_rebalance(partitions: Any) -> None:
        mine = [tp.partition for tp in partitions if tp.topic == names.events]
        guard.forget(mine)
        delivery.clear()  # as Faust clears its channel queues: never acked, fetched again or filled
        rebalanced[0] = True

    async def on_revoked(sender: Any, revoked: Any, **kwargs: Any) -> None:
        on_rebalance(revoked)

    async def on_assigned(sender: Any, assigned: Any, **kwargs: Any) -> None:
        on_rebalance(assigned)
        mine = sorted(tp.partition for tp in assigned if tp.topic == names.events)
        # one line a supervisor or a person can wait for: the member is in the group and consuming
        print(f"runlog project: group {settings.group_id(o.app_id)} assigned {len(mine)} partition(s) "
              f"of {names.events}: {mine}", file=sys.stderr, flush=True)

    app.on_partitions_revoked.connect(on_revoked)
    app.on_partitions_assigned.connect(on_assigned)

    async def close_clients(sender: Any, **kwargs: Any) -> None:
        # on the worker thread, after the batch in hand (if any)
        await asyncio.get_running_loop().run_in_executor(worker, close_committed)
        await asyncio.get_running_loop().run_in_executor(worker, gaps.close)

    app.on_before_shutdown.connect(close_clients)

    def rebuild_if_lost_at_start() -> None:
        if lost_at_start(settings, store, o.app_id):
            m.recoveries.labels("lost_at_start").inc()
            recover(settings, store, core)
            return
        if store.marker() is None:
            replay_if_topic_holds_events()

    def replay_if_topic_holds_events() -> None:
        # A new namespace, and a group with no commits, on a topic that holds events already: the
        # namespace is not whole until the group has consumed up to where the topic was now, so
        # it is marked replaying (readers ask the log) instead of ready at the first write.
        from runlog.projections.log_reader import LogReader

        with LogReader(settings, names.events, name="runlog-projector-start") as reader:
            marks = reader.watermarks()
        until = {p: high for p, (low, high) in marks.items() if high > low}
        if until and store.begin_replay(until) is not None:
            log.warning("projection namespace %r is new and the events topic holds %d records: replaying "
                        "them; the namespace reads as not ready until the group's commits reach them",
                        store.prefix, sum(marks[p][1] - marks[p][0] for p in until))

    def check_replay() -> None:
        pending = store.replay_until()
        if pending is None:
            return
        gen, until = pending
        got = committed(sorted(until))
        if all(got.get(p, -1) >= off for p, off in until.items()) and store.finish_replay(gen):
            log.warning("projection namespace %r has replayed the events topic up to where it was when "
                        "the replay began: ready", store.prefix)

    async def send_outputs(cps: list[Checkpoint], effs: list[EffectEntry]) -> None:
        sent: list[Awaitable[Any]] = []
        for cp in cps:
            sent.append(await checkpoints.send(key=cp.run_id.encode(), value=codec.encode(cp)))
        for eff in effs:
            value = codec.encode(eff.to_effect())
            sent.append(await effects.send(key=eff.delivery_key.encode(), value=value))
        await asyncio.gather(*sent)

    def publish(cps: list[Checkpoint], effs: list[EffectEntry]) -> None:
        # from the worker thread, on Faust's loop; the apply waits for the acknowledgements, so a
        # crash after it cannot lose them (a redelivered batch folds to duplicates)
        asyncio.run_coroutine_threadsafe(send_outputs(cps, effs), app_loop[0]).result(PUBLISH_TIMEOUT_S)

    def process(recs: list[RawRecord]) -> BatchResult:
        # A lost namespace is rebuilt from the log, then the batch is applied again (a no-op
        # where the replay already wrote it): its offsets are committed only after that. Redis
        # unreachable (a cluster master failing over) is waited out for the failover window.
        recoveries = 0
        unreachable_since: float | None = None
        while True:
            try:
                return core.process(recs, publish)
            except (ProjectionLost, StoreWentBack) as err:
                recoveries += 1
                if recoveries > RECOVERY_ATTEMPTS:
                    raise
                log.warning("%s", err)
                if isinstance(err, StoreWentBack):
                    store.invalidate()  # the namespace reads as lost: recover rebuilds it
                m.recoveries.labels("went_back" if isinstance(err, StoreWentBack) else "lost").inc()
                recover(settings, store, core)
            except ProjectionStoreError as err:
                now = time.monotonic()
                unreachable_since = now if unreachable_since is None else unreachable_since
                if now - unreachable_since > settings.redis_failover_ms / 1000:
                    raise
                log.warning("Redis unreachable, retrying the batch: %s", err)
                core.forget()
                time.sleep(0.5)

    def guarded(recs: list[RawRecord]) -> tuple[BatchResult, list[RawRecord]]:
        # Records the consumer skipped before this batch are read from the log and applied first;
        # the guard moves past the batch only once it is in Redis.
        if rebalanced[0]:
            rebalanced[0] = False
            core.forget()  # another member may have moved these runs meanwhile
        full, filled = guard.complete(recs)
        heals = core.heals
        res = process(full)
        guard.applied(full)
        if filled:
            m.gap_records.inc(len(filled))
        if core.heals > heals:
            m.run_heals.inc(core.heals - heals)
        return res, filled

    def ack_filled(filled: list[RawRecord]) -> None:
        # Faust never delivered these, so it would hold its commits below them forever: they are
        # applied, tell it so (its own ack bookkeeping, as for a delivered record).
        from faust.types import TP, Message

        for r in filled:
            app.consumer.ack(Message(r.topic, r.partition, r.offset, time.time(), 0, [], r.key, r.value,
                                     None, tp=TP(r.topic, r.partition)))

    async def project(stream: Any) -> None:
        # The agent's records come from ``delivery`` in whole fetches, not through ``stream``.
        loop = asyncio.get_running_loop()
        app_loop[:] = [loop]
        await loop.run_in_executor(worker, rebuild_if_lost_at_start)
        # Everything made at start (Faust, aiokafka, the clients) out of the collector's way: a
        # full collection over it took ~37 ms, a stall of every batch behind it (lag p99).
        gc.freeze()
        while True:
            batch = await delivery.take(o.batch_size, o.within)
            recs = [RawRecord(m.topic, m.partition, m.offset, m.key, m.value) for m in batch]
            links = distinct_contexts(m.headers for m in batch) if tracing.recording else []
            span = tracing.start("runlog.project", kind="consumer", attributes={"records": len(recs)},
                                 links=links)
            t0 = time.perf_counter()
            try:
                res, filled = await loop.run_in_executor(worker, guarded, recs)
            except BaseException as err:
                span.end(err)
                raise
            span.end()
            took = time.perf_counter() - t0
            sent: list[Awaitable[Any]] = []
            for dl in res.dead_letters:
                rec = to_record(dl)
                sent.append(await dlq.send(key=rec.key, value=rec.value, headers=list(rec.headers)))
            await asyncio.gather(*sent)  # checkpoints and effects were published before the apply
            observe(m, res, len(recs), took)
            ack_filled(filled)
            delivery.ack(batch)  # applied: the group may commit past them
            for r in recs:
                done[r.partition] = max(done.get(r.partition, -1), r.offset)

    async def lag() -> None:
        lags: list[tuple[int, int | None]] = []
        for tp in app.consumer.assignment():
            if tp.topic != names.events:
                continue
            hw = app.consumer.highwater(tp)
            lags.append((tp.partition, None if hw is None else max(hw - done.get(tp.partition, -1) - 1, 0)))
        m.set_lag(lags)  # revoked partitions drop out

    async def replay_done() -> None:
        await asyncio.get_running_loop().run_in_executor(worker, check_replay)

    app.agent(events, name="project")(project)
    app.timer(o.lag_every)(lag)
    app.timer(1.0)(replay_done)
    return app


def run_projector(settings: Settings, opts: ProjectorOptions | None = None) -> int:
    """Run the projector until it is stopped (SIGINT/SIGTERM); returns an exit code."""
    o = opts or ProjectorOptions()
    metrics = ProjectorMetrics()
    server = MetricsServer(metrics.registry, settings.metrics_port, settings.metrics_host) \
        if settings.metrics_port else None
    try:
        app = build_app(settings, o, metrics)
        check_credentials(settings)  # refused: one line (AuthenticationFailed), not Faust's traceback
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
