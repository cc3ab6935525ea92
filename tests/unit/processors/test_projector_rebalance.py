"""Rebalance and recovery of a projector member, driven through its methods without a Faust app or a
broker (:class:`runlog.processors.projector._projector.Projector`): the group's commits are a dict,
the log a list, Redis a :class:`~runlog.projections.MemoryStore`, the output topics and the
consumer fakes that record what they were given."""

from __future__ import annotations

import asyncio
import contextlib
import gc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from runlog.processors._tracing import Tracing
from runlog.processors.metrics import ProjectorMetrics
from runlog.processors.projector._batches import BatchDelivery
from runlog.processors.projector._offsets import OffsetGuard
from runlog.processors.projector._projector import RECOVERY_ATTEMPTS, Outputs, Projector
from runlog.projections import BatchProjector, MemoryStore, RunUpdate
from runlog.projections.batch import BatchResult, RawRecord
from runlog.projections.redis_store import ProjectionLost
from runlog.projections.store import ApplyResult, StoreWentBack
from runlog.schemas.settings import Settings
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import CODEC, records

TOPIC = "unit-member.runlog.events"
SETTINGS = Settings.from_env().with_(topic_prefix="unit-member.", tracing=False)


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass(eq=False)
class Msg:
    """A consumed record as the batch delivery hands it over (Faust's message, in what is read of it)."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    headers: list[Any] = field(default_factory=list)


def msgs(recs: list[RawRecord]) -> list[Msg]:
    return [Msg(r.topic, r.partition, r.offset, r.key, r.value) for r in recs]


class Topic:
    """An output topic: keeps what was sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes | None, bytes | None]] = []

    async def send(self, *, key: bytes | None = None, value: bytes | None = None,
                   headers: Any = None) -> Awaitable[Any]:
        self.sent.append((key, value))
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        done.set_result(None)
        return done


class Consumer:
    """Faust's consumer, in what the member asks of it; ``acked`` is what the group may commit past."""

    def __init__(self) -> None:
        self.acked: list[tuple[int, int]] = []

    def ack(self, m: Any) -> bool:
        self.acked.append((m.partition, m.offset))
        return True

    def assignment(self) -> set[TP]:
        return set()

    def highwater(self, tp: TP) -> int | None:
        return None


class Group:
    """The consumer group's committed offsets, and the log they index."""

    def __init__(self, log: list[RawRecord]) -> None:
        self.log = log
        self.commits: dict[int, int] = {}
        self.asked: list[int] = []
        self.read: list[tuple[int, int, int]] = []

    def committed(self, partitions: list[int]) -> dict[int, int]:
        self.asked.extend(partitions)
        return {p: self.commits.get(p, 0) for p in partitions}

    def commit(self, consumer: Consumer) -> None:
        """What Faust commits: one past the highest offset acknowledged (the acks here have no holes)."""
        for p, off in consumer.acked:
            self.commits[p] = max(self.commits.get(p, 0), off + 1)

    def range(self, partition: int, start: int, end: int) -> list[RawRecord]:
        self.read.append((partition, start, end))
        return [r for r in self.log if r.partition == partition and start <= r.offset < end]


class Namespace:
    """The member's namespace recovery: a recovery refolds the whole log into a new store, as the
    real one replays the events topic into the namespace."""

    def __init__(self, store: Store, log: list[RawRecord], *, lost_at_start: bool = False) -> None:
        self.store = store
        self.log = log
        self.lost = lost_at_start
        self.core: BatchProjector | None = None
        self.calls: list[str] = []

    def lost_at_start(self) -> bool:
        self.calls.append("lost_at_start")
        return self.lost

    def replay_if_new(self) -> None:
        self.calls.append("replay_if_new")

    def invalidate(self) -> None:
        self.calls.append("invalidate")

    def recover(self) -> None:
        self.calls.append("recover")
        self.store.inner = MemoryStore()
        BatchProjector(self.store.inner, CODEC).process(self.log)
        assert self.core is not None
        self.core.forget()  # as recovery.recover does with the projector's core

    def check_replay(self) -> None:
        self.calls.append("check_replay")


class Store:
    """A MemoryStore (replaced when the namespace is rebuilt) whose next applies can be made to fail."""

    def __init__(self) -> None:
        self.inner = MemoryStore()
        self.failures: list[Exception] = []
        self.after_apply: Callable[[], None] | None = None
        """Runs (once) on the applying thread after the next apply."""

    def load_state(self, run_id: str) -> Any:
        return self.inner.load_state(run_id)

    def load_states(self, run_ids: Any) -> Any:
        return self.inner.load_states(run_ids)

    def apply(self, updates: list[RunUpdate]) -> list[ApplyResult]:
        if self.failures:
            raise self.failures.pop(0)
        applied = self.inner.apply(updates)
        if self.after_apply is not None:
            hook, self.after_apply = self.after_apply, None
            hook()
        return applied


@dataclass
class Member:
    projector: Projector
    consumer: Consumer
    checkpoints: Topic
    effects: Topic
    metrics: ProjectorMetrics

    async def feed(self, recs: list[RawRecord]) -> None:
        """The consumer's fetch loop hands these records over."""
        await self.projector.delivery.deliver(msgs(recs), self.consumer)

    async def next_batch(self, n: int = 10_000) -> BatchResult:
        batch = await self.projector.delivery.take(n, 0)
        return await self.projector.apply_batch(batch)

    async def assigned(self, recs: list[RawRecord]) -> None:
        """The member starts, is assigned partition 0, and its consumer hands these records over."""
        await self.projector.start()
        await self.projector.on_assigned(None, {TP(TOPIC, 0)})
        await self.feed(recs)

    def count(self, name: str, **labels: str) -> float:
        return self.metrics.registry.get_sample_value(name, labels) or 0.0


def member(group: Group, store: Store, namespace: Namespace | None = None,
           consumer: Consumer | None = None) -> Member:
    consumer = consumer if consumer is not None else Consumer()
    checkpoints, effects = Topic(), Topic()
    metrics = ProjectorMetrics()
    core = BatchProjector(store, CODEC)  # type: ignore[arg-type]
    ns = namespace if namespace is not None else Namespace(store, group.log)
    ns.core = core
    p = Projector(SETTINGS, group="unit-member", batch_size=500, within=0.0, core=core,
                  guard=OffsetGuard(group.committed, group.range), delivery=BatchDelivery(TOPIC),
                  namespace=ns, outputs=Outputs(checkpoints=checkpoints, effects=effects, dlq=Topic(),
                                                consumer=lambda: consumer),
                  metrics=metrics, tracing=Tracing(SETTINGS))
    return Member(p, consumer, checkpoints, effects, metrics)


def the_log(runs: int = 1, stages: int = 3) -> list[RawRecord]:
    """One partition (0) holding ``runs`` runs' events, interleaved run by run."""
    events = [ev for i in range(runs) for ev in full_run(f"r{i}", stages=stages)]
    return records(events, partition=0, topic=TOPIC)


@pytest.fixture
def shutdown() -> Any:
    made: list[Member] = []
    yield made.append
    for m in made:
        m.projector.worker.shutdown()


def test_a_revoke_during_a_batch_drops_what_was_not_taken_and_the_next_assignment_starts_from_the_store(
        shutdown: Callable[[Member], None]) -> None:
    """Member A has taken records 0-4 of a partition (the rest wait in its delivery) when the
    partition moves to B, which applies 0-9 and commits while A's batch is still in hand (written
    to Redis, not acknowledged); then the partition comes back to A. A drops the records it had not
    taken, never fills from the log what B applied (its offset guard starts again from the group's
    commits) and folds the next records onto the run's state in Redis, not onto the older state its
    batch cached."""
    log = the_log(stages=3)
    assert len(log) > 15
    group, store = Group(log), Store()
    a, b = member(group, store), member(group, store)
    shutdown(a)
    shutdown(b)
    p0 = {TP(TOPIC, 0)}

    async def main() -> tuple[list[BatchResult], bool]:
        await a.projector.start()
        await b.projector.start()
        await a.projector.on_assigned(None, p0)
        await a.feed(log)
        batch = await a.projector.delivery.take(5, 0)

        async def moved() -> None:
            await a.projector.on_revoked(None, p0)
            await b.projector.on_assigned(None, p0)
            await b.feed(log[:10])  # B reads from the group's commit (none yet)
            await b.next_batch()
            group.commit(b.consumer)

        loop = asyncio.get_running_loop()
        # on A's worker, its batch written to Redis but not acknowledged yet
        store.after_apply = lambda: asyncio.run_coroutine_threadsafe(moved(), loop).result(30)
        first = await a.projector.apply_batch(batch)
        try:
            await asyncio.wait_for(a.projector.delivery.take(100, 0), 0.05)
            left = True
        except TimeoutError:
            left = False
        await b.projector.on_revoked(None, p0)
        await a.projector.on_assigned(None, p0)
        await a.feed(log[group.commits[0]:])  # A's consumer reads from the group's commit
        return [first, await a.next_batch()], left

    (first, second), left = asyncio.run(main())
    assert not left, "records delivered but not taken when the partition was revoked must be dropped"
    assert group.commits == {0: 10}
    assert first.applied == 5
    assert a.projector.guard.filled == 0 and group.read == [], "A refilled records B had applied"
    assert group.asked.count(0) == 3  # A's first batch, B's, then A's after the assignment
    # folded onto the state A's batch cached, the store refuses the write and the run is folded again
    assert second.conflicts == 0, "A folded onto its cached state, not the run's state in Redis"
    assert not second.rejected
    assert second.applied == len(log) - 10
    state = store.load_state("r0")
    assert state is not None and state.offset == len(log) - 1
    assert a.consumer.acked == [(0, o) for o in [*range(5), *range(10, len(log))]]


def test_a_rebalance_while_the_worker_applies_a_batch_makes_the_next_batch_read_the_runs_from_the_store(
        shutdown: Callable[[Member], None]) -> None:
    """The rebalance flag is set on the loop while the worker is inside a batch (the partition
    leaves A, B moves the run on, the partition comes back, all before A's batch returns): A's next
    batch still drops the states A cached and folds onto the run's state in Redis."""
    log = the_log(stages=3)
    group, store = Group(log), Store()
    a, b = member(group, store), member(group, store)
    shutdown(a)
    shutdown(b)
    p0 = {TP(TOPIC, 0)}

    async def main() -> BatchResult:
        await a.projector.start()
        await b.projector.start()
        await a.projector.on_assigned(None, p0)
        await a.feed(log[:5])

        async def moved_and_back() -> None:
            await a.projector.on_revoked(None, p0)
            await b.projector.on_assigned(None, p0)
            await b.feed(log[:10])
            await b.next_batch()
            group.commit(b.consumer)
            await b.projector.on_revoked(None, p0)
            await a.projector.on_assigned(None, p0)

        loop = asyncio.get_running_loop()
        store.after_apply = lambda: asyncio.run_coroutine_threadsafe(moved_and_back(), loop).result(30)
        await a.next_batch()
        await a.feed(log[10:])
        return await a.next_batch()

    second = asyncio.run(main())
    assert second.conflicts == 0, "the rebalance during the batch was lost: A folded onto its cached state"
    assert second.applied == len(log) - 10 and not second.rejected


def test_a_batch_redelivered_after_a_rebalance_is_not_applied_or_published_twice(
        shutdown: Callable[[Member], None]) -> None:
    """The partition is revoked and given back to the same member while its batch 0-4 is in hand
    (written to Redis, not acknowledged), with the group's commit at 3, so its consumer reads from
    offset 3 again: the member applies, publishes and counts every event once, as one pass over the
    log does."""
    log = the_log(runs=2, stages=2)
    once = BatchProjector(MemoryStore(), CODEC).process(log)
    group, store = Group(log), Store()
    a = member(group, store)
    shutdown(a)
    p0 = {TP(TOPIC, 0)}

    async def main() -> list[BatchResult]:
        await a.projector.start()
        await a.projector.on_assigned(None, p0)
        await a.feed(log[:5])

        async def back() -> None:
            group.commits[0] = 3  # what an earlier batch's acks had let the group commit
            await a.projector.on_revoked(None, p0)
            await a.projector.on_assigned(None, p0)

        loop = asyncio.get_running_loop()
        store.after_apply = lambda: asyncio.run_coroutine_threadsafe(back(), loop).result(30)
        first = await a.next_batch()
        await a.feed(log[3:])
        return [first, await a.next_batch(7), await a.next_batch()]

    results = asyncio.run(main())
    assert [r.outcomes["duplicate"] for r in results] == [0, 2, 0]
    assert sum(r.applied for r in results) == once.applied == len(log)
    assert a.count("runlog_projector_events_applied_total") == len(log)
    assert a.count("runlog_projector_duplicates_total") == 2
    assert a.checkpoints.sent == [(c.run_id.encode(), CODEC.encode(c)) for c in once.checkpoints]
    assert a.effects.sent == [(e.delivery_key.encode(), CODEC.encode(e.to_effect())) for e in once.effects]
    for run in ("r0", "r1"):
        assert store.load_state(run) == once_state(log, run)
    assert a.projector.guard.filled == 0


def once_state(log: list[RawRecord], run: str) -> Any:
    s = MemoryStore()
    BatchProjector(s, CODEC).process(log)
    return s.load_state(run)


@pytest.mark.parametrize("err, reason", [(ProjectionLost("namespace gone"), "lost"),
                                         (StoreWentBack(["r0"]), "went_back")])
def test_a_namespace_lost_during_a_batch_is_rebuilt_and_the_batch_applied_once_after_it(
        err: Exception, reason: str, shutdown: Callable[[Member], None]) -> None:
    """Redis refuses the second batch (its namespace is gone, or went back): the member rebuilds the
    namespace from the log before anything of that batch is acknowledged, then applies the batch
    again over the rebuilt namespace (duplicates where the replay wrote it), and goes on."""
    log = the_log(stages=3)
    group, store = Group(log), Store()
    ns = Namespace(store, log)
    a = member(group, store, ns)
    shutdown(a)

    async def main() -> list[BatchResult]:
        await a.projector.start()
        await a.feed(log[:6])
        first = await a.next_batch()
        store.failures.append(err)
        await a.feed(log[6:10])
        second = await a.next_batch()
        await a.feed(log[10:])
        return [first, second, await a.next_batch()]

    first, second, third = asyncio.run(main())
    want = ["lost_at_start", "replay_if_new", "recover"]
    if reason == "went_back":
        want.insert(2, "invalidate")  # the namespace must read as lost before recovering
    assert ns.calls == want
    assert a.count("runlog_projector_recoveries_total", reason=reason) == 1
    assert first.applied == 6 and second.outcomes["duplicate"] == 4 and not second.rejected
    assert third.outcomes["duplicate"] == len(log) - 10  # the replay took the whole log
    assert a.consumer.acked == [(0, o) for o in range(len(log))]
    assert store.load_state("r0") == once_state(log, "r0")


def test_a_namespace_that_stays_lost_fails_the_batch_without_acknowledging_it(
        shutdown: Callable[[Member], None]) -> None:
    log = the_log(stages=1)
    group, store = Group(log), Store()
    ns = Namespace(store, log)
    a = member(group, store, ns)
    shutdown(a)
    store.failures.extend(ProjectionLost("namespace gone") for _ in range(RECOVERY_ATTEMPTS + 1))

    async def main() -> None:
        await a.projector.start()
        await a.feed(log)
        await a.next_batch()

    with pytest.raises(ProjectionLost):
        asyncio.run(main())
    assert ns.calls.count("recover") == RECOVERY_ATTEMPTS
    assert a.consumer.acked == []


def test_a_namespace_lost_while_no_member_ran_is_rebuilt_before_the_first_batch(
        shutdown: Callable[[Member], None]) -> None:
    log = the_log(stages=1)
    group, store = Group(log), Store()
    ns = Namespace(store, log, lost_at_start=True)
    a = member(group, store, ns)
    shutdown(a)

    async def main() -> BatchResult:
        await a.projector.start()
        assert store.load_state("r0") is not None, "the first batch came before the rebuild"
        await a.feed(log)
        return await a.next_batch()

    res = asyncio.run(main())
    assert ns.calls == ["lost_at_start", "recover"]
    assert a.count("runlog_projector_recoveries_total", reason="lost_at_start") == 1
    assert res.outcomes["duplicate"] == len(log)


def test_records_the_consumer_skipped_are_read_from_the_log_and_applied_first(
        shutdown: Callable[[Member], None]) -> None:
    """Issue 38, item 6: the offset guard of :meth:`Projector.guarded`. The consumer hands over offsets
    0-2, then (a fetch position moved past a gap: a rebalance, a seek) offsets 6 on, then redelivers old
    offsets 2-4. The member reads 3-5 from the log and applies them before 6, acknowledges them for the
    group, and folds the redelivery as duplicates: the store ends as one pass over the log leaves it."""
    log = the_log(runs=1, stages=3)
    assert len(log) > 8
    once = BatchProjector(MemoryStore(), CODEC).process(log)
    group, store = Group(log), Store()
    a = member(group, store)
    shutdown(a)
    p0 = {TP(TOPIC, 0)}

    async def main() -> list[BatchResult]:
        await a.projector.start()
        await a.projector.on_assigned(None, p0)
        await a.feed(log[:3])
        first = await a.next_batch()
        await a.feed(log[6:])
        second = await a.next_batch()
        await a.feed(log[2:5])  # old records, delivered again
        return [first, second, await a.next_batch()]

    first, second, again = asyncio.run(main())
    assert group.read == [(0, 3, 6)], "the skipped offsets were not read from the log"
    assert a.projector.guard.filled == 3 and a.count("runlog_projector_gap_records_total") == 3
    assert sorted(a.consumer.acked) == sorted([(0, o) for o in range(len(log))] + [(0, 2), (0, 3), (0, 4)])
    assert first.applied + second.applied == once.applied == len(log)
    assert not second.rejected and again.applied == 0 and again.outcomes["duplicate"] == 3
    assert store.load_state("r0") == once_state(log, "r0")
    assert a.checkpoints.sent == [(c.run_id.encode(), CODEC.encode(c)) for c in once.checkpoints]


def test_redis_unreachable_at_the_replay_check_is_tried_again_and_does_not_end_the_member(
    shutdown: Any, caplog: pytest.LogCaptureFixture,
) -> None:
    """The replay check runs on a one-second Faust timer, and an exception out of a timer crashes the
    whole app: the network fault matrix's projector partitioned from Redis died there
    (``ProjectionStoreError: reading the namespace marker failed``) although its batches wait such an
    outage out."""
    from runlog.projections.redis_store import ProjectionStoreError

    class Unreachable(Namespace):
        failing = True

        def check_replay(self) -> None:
            self.calls.append("check_replay")
            if self.failing:
                raise ProjectionStoreError("reading the namespace marker failed: Connection refused")

    log = the_log()
    ns = Unreachable(Store(), log)
    m = member(Group(log), ns.store, ns)
    shutdown(m)

    async def ticks() -> None:
        await m.projector.replay_done()
        await m.projector.replay_done()  # still down: warned once
        ns.failing = False
        await m.projector.replay_done()

    with caplog.at_level("WARNING"):
        asyncio.run(ticks())
    assert ns.calls.count("check_replay") == 3
    assert sum("checking the namespace's replay failed" in r.getMessage() for r in caplog.records) == 1
    assert m.projector.replay_check_failing is False


class Flaky(Group):
    """A group whose coordinator moves: the next ``failures`` reads of its commits raise, as
    confluent-kafka's ``committed`` does while the broker restarts (``NOT_COORDINATOR``)."""

    def __init__(self, log: list[RawRecord], failures: int) -> None:
        super().__init__(log)
        self.failures = failures

    def committed(self, partitions: list[int]) -> dict[int, int]:
        if self.failures:
            self.failures -= 1
            raise RuntimeError("KafkaError{code=NOT_COORDINATOR,val=16,str=\"Failed to get committed "
                               "offsets: Broker: Not coordinator\"}")
        return super().committed(partitions)


def test_a_batch_whose_apply_fails_is_tried_again_until_applied_not_dropped(
        shutdown: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The chaos test's projector took the last record of a partition in a batch whose read of the
    group's commits failed (the coordinator moving during a broker restart): the agent crashed, Faust
    started it again on the next batch, and that record never reached Redis (nothing came after it on
    its partition to make the offset guard fill it). The member now applies the same batch again."""
    monkeypatch.setattr("runlog.processors.projector._projector.RETRY_FIRST_S", 0.01)
    log = the_log()
    group, store = Flaky(log, failures=2), Store()
    m = member(group, store)
    shutdown(m)

    async def main() -> BatchResult | None:
        await m.assigned(log)
        return await m.projector.apply_until_done(await m.projector.delivery.take(10_000, 0))

    res = asyncio.run(main())
    assert res is not None and res.applied == len(log)
    assert group.failures == 0 and group.asked == [0]
    assert sorted(m.consumer.acked) == [(0, r.offset) for r in log]
    assert store.load_state("r0") == once_state(log, "r0")
    assert m.count("runlog_projector_batch_failures_total") == 2


def test_a_failing_batch_is_dropped_at_a_rebalance_whose_assignment_fetches_it_again(
        shutdown: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """While a failed batch waits to be tried again, its partitions may move to another member: the
    batch is then dropped (never acknowledged), and the new owner, or this member again, fetches its
    records from the group's commits."""
    monkeypatch.setattr("runlog.processors.projector._projector.RETRY_FIRST_S", 0.05)
    log = the_log()
    group, store = Flaky(log, failures=100), Store()
    m = member(group, store)
    shutdown(m)

    async def main() -> BatchResult | None:
        await m.assigned(log)
        batch = await m.projector.delivery.take(10_000, 0)
        retrying = asyncio.ensure_future(m.projector.apply_until_done(batch))
        await asyncio.sleep(0.02)
        await m.projector.on_revoked(None, {TP(TOPIC, 0)})
        return await asyncio.wait_for(retrying, 5)

    assert asyncio.run(main()) is None
    assert m.consumer.acked == [] and store.load_state("r0") is None
    assert m.count("runlog_projector_batch_failures_total") >= 1


class Holding(Consumer):
    """A consumer assigned partition 0 of a log whose high watermark it knows."""

    def __init__(self, log: list[RawRecord], read: int | None = None) -> None:
        super().__init__()
        self.log = log
        self.read = len(log) - 1 if read is None else read
        """The offset of the last record the fetch loop read (every record unless given)."""

    def assignment(self) -> set[TP]:
        return {TP(TOPIC, 0)}

    def highwater(self, tp: TP) -> int | None:
        return len(self.log)

    def read_offset(self, tp: Any) -> int | None:
        assert (tp.topic, tp.partition) == (TOPIC, 0)
        return self.read


def test_the_last_records_of_a_partition_the_consumer_read_but_never_delivered_are_read_from_the_log(
        shutdown: Any, caplog: pytest.LogCaptureFixture) -> None:
    """Records the consumer skips are filled by the offset guard when a later record of the partition
    arrives; at the end of a partition none does. The lag check sees the partition stalled below its
    high watermark two ticks in a row and delivers the missing records, read from the log, once."""
    log = the_log(stages=3)
    k = len(log) - 3  # the consumer delivers all but the last three records
    group, store, holding = Group(log), Store(), Holding(log)
    m = member(group, store, consumer=holding)
    shutdown(m)

    async def main() -> tuple[int, int, int]:
        await m.assigned(log[:k])
        await m.projector.apply_until_done(await m.projector.delivery.take(10_000, 0))
        await m.projector.lag()  # first sight of the partition behind: not yet
        before = len(m.projector.delivery._pending)
        await m.projector.lag()  # the same again: stalled
        swept = len(m.projector.delivery._pending)
        await m.projector.apply_until_done(await asyncio.wait_for(m.projector.delivery.take(10_000, 0), 5))
        await m.projector.lag()
        await m.projector.lag()  # caught up: nothing more
        return before, swept, len(m.projector.delivery._pending)

    with caplog.at_level("WARNING"):
        before, swept, after = asyncio.run(main())
    assert (before, swept, after) == (0, 3, 0)
    assert group.read == [(0, k, len(log))]
    assert sorted(holding.acked) == [(0, r.offset) for r in log]
    assert store.load_state("r0") == once_state(log, "r0")
    assert m.count("runlog_projector_gap_records_total") == 3
    assert any("never reached the projector" in r.getMessage() for r in caplog.records)


def test_a_partition_whose_records_wait_in_the_delivery_or_a_batch_in_hand_is_not_swept(
        shutdown: Any) -> None:
    """Behind its high watermark but with its records on their way (waiting to be taken, or a batch
    being applied), a partition is not stalled: nothing is read from the log."""
    log = the_log()
    group, store, holding = Group(log), Store(), Holding(log)
    m = member(group, store, consumer=holding)
    shutdown(m)

    async def main() -> None:
        await m.assigned(log)
        await m.projector.lag()
        await m.projector.lag()  # waiting in the delivery
        # the agent takes the batch and holds it (its apply waits) while two more checks run
        apply, entered, release = m.projector.apply_until_done, asyncio.Event(), asyncio.Event()

        async def held(batch: list[Any]) -> BatchResult | None:
            entered.set()
            await release.wait()
            return await apply(batch)

        m.projector.apply_until_done = held  # type: ignore[method-assign]
        agent = asyncio.ensure_future(m.projector.project(None))
        try:
            await asyncio.wait_for(entered.wait(), 5)
            await m.projector.lag()
            await m.projector.lag()  # in hand
            release.set()
            while len(holding.acked) < len(log):
                await asyncio.sleep(0.01)
        finally:
            agent.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await agent
            gc.unfreeze()  # project() froze the test's heap

    asyncio.run(asyncio.wait_for(main(), 10))
    assert group.read == []
    assert sorted(holding.acked) == [(0, r.offset) for r in log]


def _swept(log: list[RawRecord], k: int, holding: Holding,
           between: Callable[[Member], Awaitable[None]] | None, shutdown: Any) -> tuple[Member, Group, int]:
    """A member applies ``log[:k]``, then two lag checks run (``between`` them, if given): how many
    records the second one delivered again."""
    group, store = Group(log), Store()
    m = member(group, store, consumer=holding)
    shutdown(m)

    async def main() -> int:
        await m.assigned(log[:k])
        await m.projector.apply_until_done(await m.projector.delivery.take(10_000, 0))
        group.commit(holding)  # Faust commits what was acknowledged
        await m.projector.lag()
        if between is not None:
            await between(m)
        await m.projector.lag()
        return len(m.projector.delivery._pending)

    return m, group, asyncio.run(main())


def test_records_the_consumer_has_not_read_yet_are_not_swept(shutdown: Any) -> None:
    """The high watermark is the broker's log end, not what the consumer read: records it has not
    read yet (a slow fetch, a leader moving) are on their way, and only those it read are swept."""
    log = the_log(stages=3)
    k = len(log) - 3
    _, group, swept = _swept(log, k, Holding(log, read=k - 1), None, shutdown)
    assert swept == 0 and group.read == []
    _, group, swept = _swept(log, k, Holding(log, read=k), None, shutdown)  # read one of the three
    assert swept == 1 and group.read == [(0, k, k + 1)]


def test_a_rebalance_between_two_checks_means_no_sweep(shutdown: Any) -> None:
    """Assigned again between the two checks, the partition's records come from the group's commits:
    nothing is read from the log."""
    log = the_log(stages=3)

    async def rebalance(m: Member) -> None:
        await m.projector.on_revoked(None, {TP(TOPIC, 0)})
        await m.projector.on_assigned(None, {TP(TOPIC, 0)})

    _, group, swept = _swept(log, len(log) - 3, Holding(log), rebalance, shutdown)
    assert swept == 0 and group.read == []


def test_records_filled_by_an_attempt_that_failed_after_its_apply_are_acknowledged_by_the_next(
        shutdown: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """An attempt fills skipped records from the log and applies them, then fails sending a dead
    letter (the broker restarting): the guard has moved past the filled records, so the next attempt
    does not fill them again, and it must still acknowledge them, or Faust never commits past them."""
    monkeypatch.setattr("runlog.processors.projector._projector.RETRY_FIRST_S", 0.01)
    log = the_log()
    bad = RawRecord(TOPIC, 0, len(log), b"r0", b"not an event")
    full = [*log, bad]
    group, store = Group(full), Store()
    m = member(group, store)
    shutdown(m)

    class FailingOnce(Topic):
        failed = False

        async def send(self, *, key: bytes | None = None, value: bytes | None = None,
                       headers: Any = None) -> Awaitable[Any]:
            if not self.failed:
                self.failed = True
                raise RuntimeError("KafkaTimeoutError: the broker is restarting")
            return await super().send(key=key, value=value, headers=headers)

    dlq = FailingOnce()
    m.projector.outputs = Outputs(checkpoints=m.checkpoints, effects=m.effects, dlq=dlq,
                                  consumer=lambda: m.consumer)

    async def main() -> BatchResult | None:
        await m.assigned(full[2:])  # the consumer skipped records 0 and 1
        return await m.projector.apply_until_done(await m.projector.delivery.take(10_000, 0))

    res = asyncio.run(main())
    assert res is not None and dlq.failed and len(dlq.sent) == 1
    assert group.read == [(0, 0, 2)]
    assert sorted(m.consumer.acked) == [(0, r.offset) for r in full]
    assert m.count("runlog_projector_batch_failures_total") == 1
