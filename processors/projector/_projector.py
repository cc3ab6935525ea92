"""One projector member: its state between the consumer group and Redis, and the callbacks of its Faust app.

:func:`runlog.processors.projector.build_app` makes the parts (the Redis store and its fold, the
batch delivery, the offset guard, the output topics) and connects the methods of a
:class:`Projector` to the Faust app: the rebalance signals, the agent, the timers. Nothing here
builds a Faust app, so rebalance and recovery are tested by calling the methods with in-memory parts.

Threads: the rebalance callbacks, the agent and the timers run on Faust's event loop; each batch's
fold, publish and Redis write, and the namespace's recovery, run on one worker thread
(:attr:`Projector.worker`). What crosses between them is the offset guard (it locks), the
rebalance flag (a :class:`threading.Event`, read once per batch) and the publish (a coroutine the
worker hands to the loop and waits for).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from runlog.processors._tracing import Tracing
from runlog.processors.dlq import to_record
from runlog.processors.metrics import ProjectorMetrics
from runlog.processors.projector._batches import BatchDelivery
from runlog.processors.projector._offsets import Committed, OffsetGuard
from runlog.projections import EffectEntry
from runlog.projections.batch import BatchProjector, BatchResult, RawRecord
from runlog.projections.recovery import lost_at_start, recover
from runlog.projections.redis_store import ProjectionLost, ProjectionStoreError, RedisStore
from runlog.projections.store import StoreWentBack
from runlog.schemas import Checkpoint, Effect
from runlog.schemas.errors import LogUnavailable, RunlogError
from runlog.schemas.internal import distinct_contexts
from runlog.schemas.settings import Settings

__all__ = ["Namespace", "Outputs", "Projector", "RedisNamespace", "Sender"]

log = logging.getLogger("runlog.processors.projector")

RECOVERY_ATTEMPTS = 3
PUBLISH_TIMEOUT_S = 120.0
RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
"""A batch whose apply failed is tried again after RETRY_FIRST_S, doubling up to RETRY_MAX_S."""
RETRY_FRESH_CLIENTS_AFTER = 3
"""From this failed attempt of a batch, the guard's Kafka clients are closed (made again at next use)."""
RETRY_LOUD_AFTER = 6
"""From this failed attempt of a batch (about 15 s), each failure is logged as an error, the first with
its traceback."""


class Sender(Protocol):
    """An output topic: a Faust topic in the app (``send`` returns once the record is queued, with
    an awaitable of its acknowledgement)."""

    async def send(self, *, key: bytes | None = None, value: bytes | None = None,
                   headers: Any = None) -> Awaitable[Any]: ...


@dataclass(frozen=True, kw_only=True)
class Outputs:
    """Where a member's batches go besides Redis, and the consumer it tells what it applied."""

    checkpoints: Sender
    effects: Sender
    dlq: Sender
    consumer: Callable[[], Any]
    """Faust's consumer (the app makes it as it starts): acknowledgements, assignment, high watermarks."""


class Namespace(Protocol):
    """How a member keeps its projection namespace whole (:class:`RedisNamespace`); called on the
    worker thread."""

    def lost_at_start(self) -> bool:
        """The namespace has no marker although the group has committed offsets (lost while no
        member ran)."""
        ...

    def replay_if_new(self) -> None:
        """A new namespace on a topic that holds events already: mark it replaying."""
        ...

    def invalidate(self) -> None:
        """Make the namespace read as lost, so that :meth:`recover` rebuilds it."""
        ...

    def recover(self) -> None:
        """Rebuild the lost namespace from the log, or adopt the one another member rebuilt."""
        ...

    def check_replay(self) -> None:
        """A replaying namespace whose group's commits reached the replay's end is marked ready."""
        ...


class RedisNamespace:
    """:class:`Namespace` of a Redis store, rebuilt from the events topic
    (:mod:`runlog.projections.recovery`)."""

    def __init__(self, settings: Settings, store: RedisStore, core: BatchProjector, *, app_id: str,
                 topic: str, committed: Committed) -> None:
        self.settings = settings
        self.store = store
        self.core = core
        self.app_id = app_id
        self.topic = topic
        self.committed = committed

    def lost_at_start(self) -> bool:
        return lost_at_start(self.settings, self.store, self.app_id)

    def replay_if_new(self) -> None:
        # A new namespace, and a group with no commits, on a topic that holds events already: the
        # namespace is not whole until the group has consumed up to where the topic was now, so
        # it is marked replaying (readers ask the log) instead of ready at the first write.
        if self.store.marker() is not None:
            return
        from runlog.projections.log_reader import LogReader

        with LogReader(self.settings, self.topic, name="runlog-projector-start") as reader:
            marks = reader.watermarks()
        until = {p: high for p, (low, high) in marks.items() if high > low}
        if until and self.store.begin_replay(until) is not None:
            log.warning("projection namespace %r is new and the events topic holds %d records: replaying "
                        "them; the namespace reads as not ready until the group's commits reach them",
                        self.store.prefix, sum(marks[p][1] - marks[p][0] for p in until))

    def invalidate(self) -> None:
        self.store.invalidate()

    def recover(self) -> None:
        recover(self.settings, self.store, self.core)

    def check_replay(self) -> None:
        pending = self.store.replay_until()
        if pending is None:
            return
        gen, until = pending
        got = self.committed(sorted(until))
        if all(got.get(p, -1) >= off for p, off in until.items()) and self.store.finish_replay(gen):
            log.warning("projection namespace %r has replayed the events topic up to where it was when "
                        "the replay began: ready", self.store.prefix)


class InlineRefused(RunlogError):
    """A batch the event loop does not apply itself (:meth:`Projector.process_inline`): to the worker."""


def faust_messages(records: Sequence[RawRecord]) -> list[Any]:
    """Records read from the log as the messages Faust's consumer delivers (what its ``ack`` takes)."""
    from faust.types import TP, Message

    now = time.time()
    return [Message(r.topic, r.partition, r.offset, now, 0, [], r.key, r.value, None,
                    tp=TP(r.topic, r.partition)) for r in records]


def _refuse_publish(cps: list[Checkpoint], effs: list[EffectEntry]) -> None:
    raise InlineRefused("publish")


def _refuse_heal(run_id: str, partition: int, offset: int) -> Any:
    raise InlineRefused("heal")


class Projector:
    """One member of the projector's consumer group.

    Its methods are the Faust app's callbacks: :meth:`on_revoked` and :meth:`on_assigned` (the
    rebalance signals), :meth:`project` (the agent), :meth:`lag` and :meth:`replay_done` (timers),
    :meth:`close_clients` (before shutdown). A batch goes :meth:`apply_batch` (on the loop) ->
    :meth:`guarded` (on the worker: the offset guard fills what the consumer skipped) ->
    :meth:`process` (the fold and the Redis write, recovering a lost namespace) -> :meth:`publish`
    (back on the loop, waited for).
    """

    def __init__(self, settings: Settings, *, group: str, batch_size: int, within: float,
                 core: BatchProjector, guard: OffsetGuard, delivery: BatchDelivery, namespace: Namespace,
                 outputs: Outputs, metrics: ProjectorMetrics, tracing: Tracing,
                 closers: Sequence[Callable[[], object]] = (), inline_records: int = 0) -> None:
        self.settings = settings
        self.inline_records = inline_records
        """Batches of at most this many records are folded and written on the event loop itself
        (:meth:`run_batch`); 0: every batch on the worker."""
        self.inline_batches = 0
        self.inline_refused = 0
        """Batches applied on the loop, and batches the loop handed on to the worker (counters for tests)."""
        self.group = group
        """The consumer group's id (the app id)."""
        self.batch_size = batch_size
        self.within = within
        """Batches of up to ``batch_size`` records, waiting up to ``within`` seconds for them
        (:class:`~runlog.processors.projector.ProjectorOptions`)."""
        self.topic = delivery.topic
        self.core = core
        self.guard = guard
        self.delivery = delivery
        self.namespace = namespace
        self.outputs = outputs
        self.metrics = metrics
        self.tracing = tracing
        self.closers = tuple(closers)
        """Run on the worker before shutdown, after the batch in hand (the clients of ``guard``'s reads)."""
        self.worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="project")
        """The one thread that folds and writes batches (and recovers the namespace)."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """Faust's event loop, set as the agent starts: the worker publishes on it."""
        self.rebalanced = threading.Event()
        """Set on the loop by each assignment or revoke; the worker clears it and drops its cached
        run states before its next batch (another member may have moved those runs meanwhile)."""
        self.done: dict[int, int] = {}
        """Per partition, the last offset applied (read by :meth:`lag`, on the loop)."""
        self.replay_check_failing = False
        """:meth:`replay_done`'s last check failed (Redis unreachable): warned once per outage."""
        self.in_hand = 0
        """Batches taken from the delivery and not yet applied or dropped (0 or 1: one agent)."""
        self.closing = False
        """Set before shutdown, once the clients are closed (:meth:`close_clients`)."""
        self.behind: dict[int, tuple[int, int, int]] = {}
        """Per partition behind its high watermark at the last tick of :meth:`lag`: (next offset to
        apply, high watermark, the delivery's generation) (:meth:`sweep_tails`)."""

    # rebalances (on the loop)

    def on_rebalance(self, partitions: Any) -> None:
        mine = [tp.partition for tp in partitions if tp.topic == self.topic]
        self.guard.forget(mine)
        self.delivery.clear()  # as Faust clears its channel queues: never acked, fetched again or filled
        self.rebalanced.set()

    async def on_revoked(self, sender: Any, revoked: Any, **kwargs: Any) -> None:
        self.on_rebalance(revoked)

    async def on_assigned(self, sender: Any, assigned: Any, **kwargs: Any) -> None:
        self.on_rebalance(assigned)
        mine = sorted(tp.partition for tp in assigned if tp.topic == self.topic)
        # one line a supervisor or a person can wait for: the member is in the group and consuming
        print(f"runlog project: group {self.group} assigned {len(mine)} partition(s) of {self.topic}: "
              f"{mine}", file=sys.stderr, flush=True)

    async def close_clients(self, sender: Any, **kwargs: Any) -> None:
        self.closing = True  # no tail check makes them again
        await self.close_readers()

    # the worker thread

    def publish_writer_schemas(self) -> None:
        # The first encode of a checkpoint or an effect would publish its writer schema and wait
        # for the broker's acknowledgement, on the event loop: measured in the bench's lag
        # section, a stall of about 500 ms of every record behind the first checkpoint.
        try:
            self.core.codec.publish_writer_schemas(Checkpoint, Effect)
        except LogUnavailable as err:  # the first encode tries again, and reports it there
            log.warning("publishing the writer schemas of checkpoints and effects failed: %s", err)

    def rebuild_if_lost_at_start(self) -> None:
        if self.namespace.lost_at_start():
            self.metrics.recoveries.labels("lost_at_start").inc()
            self.namespace.recover()
            return
        self.namespace.replay_if_new()

    async def send_outputs(self, cps: list[Checkpoint], effs: list[EffectEntry]) -> None:
        encode = self.core.codec.encode
        checkpoints, effects = self.outputs.checkpoints, self.outputs.effects
        sent: list[Awaitable[Any]] = []
        for cp in cps:
            sent.append(await checkpoints.send(key=cp.run_id.encode(), value=encode(cp)))
        for eff in effs:
            sent.append(await effects.send(key=eff.delivery_key.encode(), value=encode(eff.to_effect())))
        await asyncio.gather(*sent)

    def publish(self, cps: list[Checkpoint], effs: list[EffectEntry]) -> None:
        # from the worker thread, on Faust's loop; the apply waits for the acknowledgements, so a
        # crash after it cannot lose them (a redelivered batch folds to duplicates)
        assert self.loop is not None, "publish before the agent started"
        asyncio.run_coroutine_threadsafe(self.send_outputs(cps, effs), self.loop).result(PUBLISH_TIMEOUT_S)

    def process(self, recs: list[RawRecord]) -> BatchResult:
        # A lost namespace is rebuilt from the log, then the batch is applied again (a no-op
        # where the replay already wrote it): its offsets are committed only after that. Redis
        # unreachable (a cluster master failing over) is waited out for the failover window.
        recoveries = 0
        unreachable_since: float | None = None
        while True:
            try:
                return self.core.process(recs, self.publish)
            except (ProjectionLost, StoreWentBack) as err:
                recoveries += 1
                if recoveries > RECOVERY_ATTEMPTS:
                    raise
                log.warning("%s", err)
                if isinstance(err, StoreWentBack):
                    self.namespace.invalidate()  # the namespace reads as lost: recover rebuilds it
                reason = "went_back" if isinstance(err, StoreWentBack) else "lost"
                self.metrics.recoveries.labels(reason).inc()
                self.namespace.recover()
            except ProjectionStoreError as err:
                now = time.monotonic()
                unreachable_since = now if unreachable_since is None else unreachable_since
                if now - unreachable_since > self.settings.redis_failover_ms / 1000:
                    raise
                log.warning("Redis unreachable, retrying the batch: %s", err)
                self.core.forget()
                time.sleep(0.5)

    def process_inline(self, recs: list[RawRecord]) -> BatchResult:
        # On the event loop: the fold and the Redis write of a batch that needs nothing else. A
        # batch that would publish (checkpoints, effects), heal a run from the log, or meet a lost
        # or unreachable namespace raises InlineRefused before anything is written (publish and
        # heal come before the apply; a lost namespace refuses the apply) and is done again on the
        # worker, which can wait; a retried apply's runs written before the refusal are
        # duplicates there, which the offset guard ignores.
        heal = self.core.heal
        self.core.heal = None if heal is None else _refuse_heal
        try:
            return self.core.process(recs, _refuse_publish)
        except (ProjectionLost, StoreWentBack, ProjectionStoreError) as err:
            raise InlineRefused(type(err).__name__) from err
        finally:
            self.core.heal = heal

    def guarded(self, recs: list[RawRecord], *, inline: bool = False) -> tuple[BatchResult, list[RawRecord]]:
        # Records the consumer skipped before this batch are read from the log and applied first;
        # the guard moves past the batch only once it is in Redis.
        if self.rebalanced.is_set():
            self.rebalanced.clear()  # before the forget: a rebalance after it is seen by the next batch
            self.core.forget()  # another member may have moved these runs meanwhile
        full, filled = self.guard.complete(recs)
        heals = self.core.heals
        res = self.process_inline(full) if inline else self.process(full)
        self.guard.applied(full)
        if filled:
            self.metrics.gap_records.inc(len(filled))
        if self.core.heals > heals:
            self.metrics.run_heals.inc(self.core.heals - heals)
        return res, filled

    # the agent and the timers (on the loop)

    def ack_filled(self, filled: list[RawRecord]) -> None:
        # Faust never delivered these, so it would hold its commits below them forever: they are
        # applied, tell it so (its own ack bookkeeping, as for a delivered record).
        if not filled:
            return
        consumer = self.outputs.consumer()
        for m in faust_messages(filled):
            consumer.ack(m)

    async def start(self) -> None:
        """Before the first batch: note the loop, publish the writer schemas of what the member
        writes, recover a namespace lost while no member ran (all on the worker)."""
        self.loop = asyncio.get_running_loop()
        await self.loop.run_in_executor(self.worker, self.publish_writer_schemas)
        await self.loop.run_in_executor(self.worker, self.rebuild_if_lost_at_start)

    def inline_ok(self, recs: list[RawRecord]) -> bool:
        # Nothing to ask Kafka first: no rebalance since the last batch, and the guard knows where
        # each partition of the batch stands with no gap before it (else it would read the group's
        # commits or the log: broker round trips, which the worker makes, not the loop).
        if self.rebalanced.is_set():
            return False
        nxt = self.guard.next_offsets()
        first: dict[int, int] = {}
        for r in recs:
            first.setdefault(r.partition, r.offset)
        return all(p in nxt and off <= nxt[p] for p, off in first.items())

    async def run_batch(self, recs: list[RawRecord]) -> tuple[BatchResult, list[RawRecord]]:
        # A small batch (light load) is applied on the loop: handing it to the worker thread and
        # back costs two thread wake-ups and two GIL hand-offs, which on a busy host were most of
        # the lag of a record at low load (docs/performance.md, "The latency floor"). A big one, or
        # one the loop cannot finish alone, goes to the worker, so the loop stays free under load.
        assert self.loop is not None
        if len(recs) <= self.inline_records and self.inline_ok(recs):
            try:
                out = self.guarded(recs, inline=True)
                self.inline_batches += 1
                return out
            except InlineRefused:
                self.inline_refused += 1
        return await self.loop.run_in_executor(self.worker, self.guarded, recs)

    async def apply_batch(self, batch: list[Any],
                          filled_before: list[RawRecord] | None = None) -> BatchResult:
        """Apply one batch taken from the delivery (Faust's messages), then acknowledge it.

        ``filled_before``: the records an earlier attempt at this batch filled in from the log (the
        guard has moved past them, so this attempt does not fill them again); the records this one
        fills are added to it, and all are acknowledged with the batch."""
        assert self.loop is not None, "a batch before start()"
        recs = [RawRecord(m.topic, m.partition, m.offset, m.key, m.value) for m in batch]
        links = distinct_contexts(m.headers for m in batch) if self.tracing.recording else []
        span = self.tracing.start("runlog.project", kind="consumer", attributes={"records": len(recs)},
                                  links=links)
        t0 = time.perf_counter()
        try:
            res, filled = await self.run_batch(recs)
        except BaseException as err:
            span.end(err)
            raise
        span.end()
        if filled_before is not None:
            filled_before.extend(filled)
            filled = filled_before
        took = time.perf_counter() - t0
        dlq = self.outputs.dlq
        sent: list[Awaitable[Any]] = []
        for dl in res.dead_letters:
            rec = to_record(dl)
            sent.append(await dlq.send(key=rec.key, value=rec.value, headers=list(rec.headers)))
        await asyncio.gather(*sent)  # checkpoints and effects were published before the apply
        self.metrics.observe_batch(res, len(recs), took)
        self.ack_filled(filled)
        self.delivery.ack(batch)  # applied: the group may commit past them
        done = self.done
        for r in recs:
            done[r.partition] = max(done.get(r.partition, -1), r.offset)
        return res

    async def project(self, stream: Any) -> None:
        """The agent: its records come from the delivery in whole fetches, not through ``stream``."""
        await self.start()
        # Everything made at start (Faust, aiokafka, the clients) out of the collector's way: a
        # full collection over it took ~37 ms, a stall of every batch behind it (lag p99).
        gc.freeze()
        take, batch_size, within = self.delivery.take, self.batch_size, self.within
        while True:
            batch = await take(batch_size, within)
            self.in_hand += 1
            try:
                await self.apply_until_done(batch)
            finally:
                self.in_hand -= 1

    async def apply_until_done(self, batch: list[Any]) -> BatchResult | None:
        """Apply one batch, trying it again until it is applied or a rebalance drops it (None).

        A batch that raised was neither acknowledged nor moved past by the offset guard, and the
        consumer has read past its records: were the agent to crash on it (Faust then starts the agent
        again on the next batch), its records would wait until a later record of the same partition
        made the guard fill them from the log; the last records of a partition, never (a run whose
        last events are not in Redis, seen by the chaos test after a group coordinator moved during
        the guard's read of the commits). Applying a batch again is safe: each apply is idempotent
        (the offset compare-and-set) and what it published before failing is published again, as at
        a redelivery. After a rebalance the records this member kept are fetched again from the
        group's commits, so the batch is dropped instead."""
        generation = self.delivery.generation
        delay = RETRY_FIRST_S
        attempt = 0
        failing_since = 0.0
        filled: list[RawRecord] = []
        try:
            while True:
                try:
                    return await self.apply_batch(batch, filled)
                except Exception as err:  # any failure: the batch is tried again, never lost
                    attempt += 1
                    self.metrics.batch_failures.inc()
                    now = time.monotonic()
                    failing_since = failing_since or now
                    self.metrics.batch_retrying.set(now - failing_since)
                    if self.delivery.generation != generation:
                        log.warning("applying a batch of %d records failed (%s: %s); a rebalance since then "
                                    "fetches its records again from the group's commits", len(batch),
                                    type(err).__name__, err)
                        return None
                    log.log(logging.WARNING if attempt < RETRY_LOUD_AFTER else logging.ERROR,
                            "applying a batch of %d records failed (attempt %d, failing for %.0fs), trying "
                            "it again in %.1fs: %s: %s", len(batch), attempt, now - failing_since, delay,
                            type(err).__name__, err, exc_info=attempt in (1, RETRY_LOUD_AFTER))
                    if attempt >= RETRY_FRESH_CLIENTS_AFTER:
                        await self.close_readers()  # made again at next use: a client stuck since a fault
                    await asyncio.sleep(delay)
                    if self.delivery.generation != generation:
                        return None
                    delay = min(delay * 2, RETRY_MAX_S)
        finally:
            if failing_since:
                self.metrics.batch_retrying.set(0)

    async def close_readers(self) -> None:
        """Close the clients the offset guard reads with (the group's commits, the log), on the worker
        after the batch in hand; each is made again at its next use."""
        loop = asyncio.get_running_loop()
        for close in self.closers:
            await loop.run_in_executor(self.worker, close)

    async def lag(self) -> None:
        lags: list[tuple[int, int | None]] = []
        marks: dict[int, int] = {}
        done = self.done
        consumer = self.outputs.consumer()
        for tp in consumer.assignment():
            if tp.topic != self.topic:
                continue
            hw = consumer.highwater(tp)
            lags.append((tp.partition, None if hw is None else max(hw - done.get(tp.partition, -1) - 1, 0)))
            if hw is not None:
                marks[tp.partition] = hw
        self.metrics.set_lag(lags)  # revoked partitions drop out
        await self.sweep_tails(marks)

    async def sweep_tails(self, marks: dict[int, int]) -> None:
        """Deliver again, from the log, records at the end of a partition that the consumer read but
        that never reached the projector (``marks``: the high watermark of each assigned partition, at
        each tick of :meth:`lag`).

        The offset guard fills records the consumer skipped once a later record of their partition
        arrives; the last records of a partition have none after them. A partition is stalled when
        two ticks in a row saw the same next offset to apply, below the same high watermark and below
        the consumer's read position, with no rebalance, no batch in hand and none of its records
        waiting in the delivery: the records from the next offset up to the last one the consumer read
        (at most ``batch_size``) are read from the log and delivered as a batch of their own. Were
        the consumer to deliver them too, they are redeliveries: the fold ignores them and Faust
        counts each acknowledgement once."""
        if self.closing:
            return
        try:
            await self._sweep_tails(marks)
        except Exception as err:  # noqa: BLE001 - a timer's exception would end the member: next tick
            log.warning("checking the ends of the assigned partitions failed, trying again at the next "
                        "check: %s: %s", type(err).__name__, err)

    def _read_upto(self, partition: int, hw: int) -> int:
        """One past the last offset of ``partition`` the consumer read (capped at ``hw``); the high
        watermark when the consumer cannot say."""
        from faust.types import TP

        read_offset = getattr(self.outputs.consumer(), "read_offset", None)
        if read_offset is None:
            return hw
        got = read_offset(TP(self.topic, partition))
        return hw if got is None else min(hw, got + 1)

    async def _sweep_tails(self, marks: dict[int, int]) -> None:
        assert self.loop is not None
        generation = self.delivery.generation
        holding = [p for p, hw in marks.items() if hw > 0]
        nxt = self.guard.next_offsets()
        if any(p not in nxt for p in holding):
            await self.loop.run_in_executor(self.worker, self.guard.learn, holding)
            nxt = self.guard.next_offsets()
        waiting = self.delivery.pending_partitions()
        seen, self.behind = self.behind, {}
        stalled: list[tuple[int, int, int]] = []
        for p, hw in marks.items():
            n, upto = nxt.get(p), self._read_upto(p, hw)
            if n is None or n >= upto or p in waiting:
                continue
            self.behind[p] = (n, upto, generation)
            if seen.get(p) == (n, upto, generation) and self.in_hand == 0:
                stalled.append((p, n, min(upto, n + self.batch_size)))
        for p, start, end in stalled:
            recs = await self.loop.run_in_executor(self.worker, self.guard.read, p, start, end)
            moved = (self.delivery.generation != generation or self.guard.next_offsets().get(p) != start
                     or self.in_hand or p in self.delivery.pending_partitions())
            if not recs or moved:
                continue  # moved meanwhile: seen again at the next ticks if still stalled
            again = faust_messages(recs)
            if await self.delivery.deliver(again, self.outputs.consumer(), generation=generation):
                log.warning("partition %d: records %d..%d were read by the consumer but never reached the "
                            "projector; read %d of them from the log and delivered them again", p, start,
                            end - 1, len(recs))
                self.metrics.gap_records.inc(len(recs))
                self.behind.pop(p, None)

    async def replay_done(self) -> None:
        # A timer: Redis unreachable here (a partition, a failover) is tried again on its next tick. It
        # must not end the member: an exception out of a Faust timer crashes the whole app, while the
        # batches wait such an outage out for the failover window (:meth:`process`).
        try:
            await asyncio.get_running_loop().run_in_executor(self.worker, self.namespace.check_replay)
        except ProjectionStoreError as err:
            if not self.replay_check_failing:
                log.warning("checking the namespace's replay failed, trying again each second: %s", err)
            self.replay_check_failing = True
        else:
            self.replay_check_failing = False
