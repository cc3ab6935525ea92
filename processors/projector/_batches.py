"""Whole fetches to the projector's agent, below Faust's per-record stream.

Faust hands a consumed record to an agent through its conductor, a channel queue and the stream:
per record, two tasks raced against the flow being suspended, a queue put and get, an ``Event``
and its acknowledgement through the stream. Measured with the projector's own app and settings on
this machine, that path delivers 8.5-12k records a second to an agent that only counts them, while
aiokafka's ``getmany`` below it returns over 500k a second: the per-record stream, not the
consumer, was the projector's ceiling.

:class:`BatchConsumer` keeps Faust's consumer (its group membership, rebalances, read offsets,
gaps, flow control, commits) and changes one thing in its fetch loop: the records of a topic that
has a :class:`BatchDelivery` are collected per fetch and handed over in one call, instead of one
callback per record. The agent takes them from the delivery (:meth:`BatchDelivery.take`, the
same ``batch_size`` and ``within`` as ``take_events``) and acknowledges each record to the
consumer itself once the batch is applied (:meth:`BatchDelivery.ack`), so Faust commits only
offsets whose records are in Redis, as before. Undelivered batches are dropped when partitions
are revoked, as Faust clears its channel queues; the projector's offset guard fills whatever a
consumer skipped (:mod:`runlog.processors.projector._offsets`).

Records of any other topic go through Faust's own path unchanged.

:class:`BatchConsumerThread` sets the two fetch settings Faust does not let an app choose: the fewest
bytes a fetch waits for (``fetch_min_bytes``, which Faust leaves at aiokafka's default, 1) and how long
it waits for them at most (``fetch_max_wait_ms``, which Faust fixes at 1,500 ms). With one byte a fetch
returns as soon as one record is there, so at a few thousand events a second the consumer thread made a
fetch every few records, each a round of Python work in its own thread, holding the interpreter against
the thread that applies the batches (docs/performance.md, "Fetch sizes at low load").
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Iterable
from typing import Any, ClassVar

from faust.transport.consumer import CONSUMER_FETCHING
from faust.transport.drivers import aiokafka as faust_aiokafka

__all__ = ["BatchConsumer", "BatchConsumerThread", "BatchDelivery", "BatchTransport", "install"]


class BatchDelivery:
    """The records of one topic, fetched by :class:`BatchConsumer`, waiting for the agent.

    At most ``max_pending`` records wait (the consumer's fetch loop waits for room, as it waits for
    a full channel queue in Faust's own path); one event loop uses it.
    """

    def __init__(self, topic: str, *, max_pending: int = 10_000) -> None:
        self.topic = topic
        self.max_pending = max_pending
        self._pending: deque[Any] = deque()
        self._changed: asyncio.Event | None = None
        self._consumer: Any = None
        self.delivered = 0
        """Records handed over since the start (a counter for tests)."""
        self.generation = 0
        """Moves at each :meth:`clear` (a rebalance): a batch taken before it may hold records of
        partitions this member no longer owns, and those it keeps are fetched again from the group's
        commits."""

    def _event(self) -> asyncio.Event:
        if self._changed is None:
            self._changed = asyncio.Event()
        return self._changed

    async def deliver(self, messages: list[Any], consumer: Any, *, generation: int | None = None) -> bool:
        """From the consumer's fetch loop: hand over one fetch's records of the topic. With
        ``generation``, the records are dropped (False) if a rebalance cleared the delivery since
        then, while they waited for room."""
        self._consumer = consumer
        changed = self._event()
        while len(self._pending) >= self.max_pending:
            changed.clear()
            await changed.wait()
        if generation is not None and generation != self.generation:
            return False
        self._pending.extend(messages)
        self.delivered += len(messages)
        changed.set()
        return True

    def pending_partitions(self) -> set[int]:
        """The partitions of the records waiting to be taken."""
        return {m.partition for m in self._pending}

    def clear(self) -> int:
        """Drop every record not yet taken (partitions revoked); returns how many."""
        n = len(self._pending)
        self._pending.clear()
        self.generation += 1
        if self._changed is not None:
            self._changed.set()
        return n

    async def take(self, max_records: int, within: float) -> list[Any]:
        """The next batch: waits for a first record, then up to ``within`` seconds for the batch to
        reach ``max_records``; records already waiting are taken at once."""
        changed = self._event()
        loop = asyncio.get_running_loop()
        while True:
            while not self._pending:
                changed.clear()
                await changed.wait()
            deadline = loop.time() + within
            while len(self._pending) < max_records:
                left = deadline - loop.time()
                if left <= 0:
                    break
                changed.clear()
                try:
                    await asyncio.wait_for(changed.wait(), left)
                except TimeoutError:
                    break
            if self._pending:  # else a revoke dropped them while waiting: never an empty batch
                break
        n = min(max_records, len(self._pending))
        batch = [self._pending.popleft() for _ in range(n)]
        changed.set()  # room for the fetch loop
        return batch

    def ack(self, messages: Iterable[Any]) -> None:
        """The records are applied: the consumer may commit past them."""
        if self._consumer is None:
            return
        ack = self._consumer.ack
        for m in messages:
            ack(m)


class BatchConsumerThread(faust_aiokafka.AIOKafkaConsumerThread):  # type: ignore[misc]
    """Faust's consumer thread whose aiokafka consumer fetches at least ``fetch_min_bytes`` (waiting
    ``fetch_wait_ms`` at most for them)."""

    fetch_min_bytes: ClassVar[int] = 1
    fetch_wait_ms: ClassVar[int] = 1500
    """Replaced per app by :func:`install`."""

    def _create_worker_consumer(self, transport: Any) -> Any:
        consumer = super()._create_worker_consumer(transport)
        # Faust passes no fetch_min_bytes and a fixed fetch_max_wait_ms; aiokafka keeps what its
        # constructor was given in these two attributes and hands them to the fetcher it makes in
        # start() (aiokafka 0.14, this project's)
        for attr in ("_fetch_min_bytes", "_fetch_max_wait_ms"):
            if not hasattr(consumer, attr):
                raise RuntimeError(f"aiokafka's consumer has no {attr}: this aiokafka is not one the "
                                   "projector's fetch settings are made for")
        consumer._fetch_min_bytes = self.fetch_min_bytes
        consumer._fetch_max_wait_ms = self.fetch_wait_ms
        return consumer


class BatchConsumer(faust_aiokafka.Consumer):  # type: ignore[misc]
    """Faust's aiokafka consumer whose fetch loop hands the records of a batch topic over per fetch."""

    deliveries: ClassVar[dict[str, BatchDelivery]] = {}
    """Replaced per app by :func:`install` (a class per app, so two apps in one process differ)."""
    thread_class: ClassVar[type[BatchConsumerThread]] = BatchConsumerThread

    def _new_consumer_thread(self) -> Any:
        return self.thread_class(self, loop=self.loop, beacon=self.beacon)

    def read_offset(self, tp: Any) -> int | None:
        """The offset of the last record of ``tp`` the fetch loop read (None: none since the assignment
        or the last seek)."""
        got: int | None = self._read_offset.get(tp)
        return got

    async def _drain_messages(self, fetcher: Any) -> None:
        # Faust's Consumer._drain_messages (faust-streaming 0.15), with the records of the
        # delivery topics collected per fetch instead of one callback each.
        deliveries = self.deliveries
        callback = self.callback
        getmany = self.getmany
        consumer_should_stop = self._stopped.is_set
        fetcher_should_stop = fetcher._stopped.is_set
        get_read_offset = self._read_offset.__getitem__
        set_read_offset = self._read_offset.__setitem__
        acks_enabled_for = self.app.topics.acks_enabled_for
        commit_every = self._commit_every
        yield_every = 100
        since_yield = 0
        try:
            while not (consumer_should_stop() or fetcher_should_stop()):
                self.diag.set_flag(CONSUMER_FETCHING)
                ait = getmany(timeout=1.0)
                await self.sleep(0)
                if self.should_stop:
                    continue
                fetched: dict[str, list[Any]] = {}
                async for tp, message in ait:
                    since_yield += 1
                    if since_yield > yield_every:
                        await asyncio.sleep(0)
                        since_yield = 0
                    offset = message.offset
                    r_offset = get_read_offset(tp)
                    if r_offset is not None and offset < r_offset:
                        continue  # read before: Faust drops it too
                    if r_offset and offset - r_offset > 1 and acks_enabled_for(message.topic):
                        await self._add_gap(tp, r_offset + 1, offset)
                    if commit_every is not None and self._n_acked >= commit_every:  # type: ignore[has-type]
                        self._n_acked = 0
                        await self.commit()
                    if tp.topic in deliveries:
                        fetched.setdefault(tp.topic, []).append(message)
                    else:
                        await self.wait_first(callback(message), self.suspend_flow.wait())
                    set_read_offset(tp, offset)
                for topic, messages in fetched.items():
                    await self.wait_first(deliveries[topic].deliver(messages, self), self.suspend_flow.wait())
                self.diag.unset_flag(CONSUMER_FETCHING)
        except self.consumer_stopped_errors:
            if self.transport.app.should_stop:
                return
            raise
        except asyncio.CancelledError:
            if self.transport.app.should_stop:
                return
            raise
        finally:
            self.diag.unset_flag(CONSUMER_FETCHING)


class BatchTransport(faust_aiokafka.Transport):  # type: ignore[misc]
    """Faust's aiokafka transport with :class:`BatchConsumer`."""


def install(app: Any, deliveries: Iterable[BatchDelivery], *, fetch_min_bytes: int = 1,
            fetch_wait_ms: int = 1500) -> None:
    """Make ``app`` consume through a :class:`BatchConsumer` that hands over ``deliveries``' topics,
    its fetches waiting for ``fetch_min_bytes`` (``fetch_wait_ms`` at most; :class:`BatchConsumerThread`).

    Call right after the app is made, before its consumer exists. Each topic is also registered
    with Faust's conductor (subscribed, and acknowledged records counted towards commits).
    """
    by_topic = {d.topic: d for d in deliveries}
    thread_cls = type("BatchConsumerThread", (BatchConsumerThread,),
                      {"fetch_min_bytes": fetch_min_bytes, "fetch_wait_ms": fetch_wait_ms})
    consumer_cls = type("BatchConsumer", (BatchConsumer,),
                        {"deliveries": by_topic, "thread_class": thread_cls})
    transport_cls = type("BatchTransport", (BatchTransport,), {"Consumer": consumer_cls})
    app.transport = transport_cls(app.conf.broker_consumer, app)
