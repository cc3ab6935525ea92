"""The projector's records arrive in whole fetches below Faust's per-record stream
(``runlog.processors.projector._batches``): what the fetch loop hands over, what a batch holds, and what
is acknowledged."""

from __future__ import annotations

import asyncio
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import aiokafka
import faust
import pytest
from faust.transport.drivers import aiokafka as faust_aiokafka

from runlog.processors.projector import ProjectorOptions, build_app
from runlog.processors.projector._batches import BatchConsumer, BatchConsumerThread, BatchDelivery, install
from runlog.schemas.settings import Settings


@dataclass(frozen=True)
class TP:
    topic: str
    partition: int


@dataclass(eq=False)
class Msg:
    topic: str
    partition: int
    offset: int
    key: bytes = b"k"
    value: bytes = b"v"
    headers: list[Any] = field(default_factory=list)

    @property
    def tp(self) -> TP:
        return TP(self.topic, self.partition)


class Acks:
    def __init__(self) -> None:
        self.acked: list[int] = []

    def ack(self, m: Msg) -> bool:
        self.acked.append(m.offset)
        return True


def msgs(topic: str, partition: int, offsets: range | list[int]) -> list[Msg]:
    return [Msg(topic, partition, o) for o in offsets]


def test_take_returns_what_waits_at_once_up_to_the_batch_size_and_keeps_the_rest() -> None:
    async def main() -> tuple[list[int], list[int], float]:
        d = BatchDelivery("ev")
        await d.deliver(msgs("ev", 0, range(7)), Acks())
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        first = await d.take(5, within=5.0)  # full: no wait for more
        took = loop.time() - t0
        second = await d.take(5, within=0.01)
        return [m.offset for m in first], [m.offset for m in second], took

    first, second, took = asyncio.run(main())
    assert first == [0, 1, 2, 3, 4]
    assert second == [5, 6]
    assert took < 1.0


def test_take_waits_within_for_the_batch_to_fill_then_returns_what_it_has() -> None:
    async def main() -> list[int]:
        d = BatchDelivery("ev")
        ackr = Acks()

        async def later() -> None:
            await asyncio.sleep(0.05)
            await d.deliver(msgs("ev", 1, [10, 11]), ackr)

        await d.deliver(msgs("ev", 0, [0]), ackr)
        task = asyncio.create_task(later())
        got = await d.take(100, within=0.5)
        await task
        return [m.offset for m in got]

    assert asyncio.run(main()) == [0, 10, 11]


def test_the_fetch_loop_waits_for_room_and_a_revoke_drops_what_was_not_taken() -> None:
    async def main() -> tuple[bool, int, list[int], int]:
        d = BatchDelivery("ev", max_pending=3)
        ackr = Acks()
        await d.deliver(msgs("ev", 0, range(3)), ackr)
        blocked = asyncio.create_task(d.deliver(msgs("ev", 0, range(3, 5)), ackr))
        await asyncio.sleep(0.05)
        waited = not blocked.done()
        got = await d.take(2, within=0)
        await asyncio.wait_for(blocked, 1.0)
        dropped = d.clear()
        return waited, dropped, [m.offset for m in got], d.delivered

    waited, dropped, got, delivered = asyncio.run(main())
    assert waited, "a full delivery must hold the fetch loop back"
    assert got == [0, 1]
    assert dropped == 3  # offsets 2, 3, 4: never acknowledged
    assert delivered == 5


def test_a_revoke_while_take_waits_for_more_never_yields_an_empty_batch() -> None:
    async def main() -> list[int]:
        d = BatchDelivery("ev")
        ackr = Acks()
        await d.deliver(msgs("ev", 0, [0]), ackr)
        task = asyncio.create_task(d.take(10, within=0.2))
        await asyncio.sleep(0.02)
        d.clear()  # partitions revoked while the batch waits to fill
        await asyncio.sleep(0.3)
        assert not task.done(), "a batch with nothing in it was returned"
        await d.deliver(msgs("ev", 1, [5]), ackr)
        got = await asyncio.wait_for(task, 1.0)
        return [m.offset for m in got]

    assert asyncio.run(main()) == [5]


def test_ack_acknowledges_each_record_to_the_consumer_that_delivered_it() -> None:
    async def main() -> list[int]:
        d = BatchDelivery("ev")
        ackr = Acks()
        await d.deliver(msgs("ev", 0, range(4)), ackr)
        batch = await d.take(3, within=0)
        d.ack(batch)
        return ackr.acked

    assert asyncio.run(main()) == [0, 1, 2]


class FakeFetcher:
    def __init__(self) -> None:
        self._stopped = asyncio.Event()


class FakeConsumer:
    """What BatchConsumer._drain_messages reads of Faust's consumer, with a scripted getmany."""

    consumer_stopped_errors: tuple[type[BaseException], ...] = (RuntimeError,)

    def __init__(self, fetches: list[list[Msg]], deliveries: dict[str, BatchDelivery],
                 fetcher: FakeFetcher) -> None:
        self.deliveries = deliveries
        self._fetches = fetches
        self._fetcher = fetcher
        self._stopped = asyncio.Event()
        self._read_offset: defaultdict[TP, int | None] = defaultdict(lambda: None)  # as Faust's
        self._commit_every = None
        self._n_acked = 0
        self.callback_got: list[tuple[str, int]] = []
        self.gaps: list[tuple[TP, int, int]] = []
        self.suspend_flow = asyncio.Event()
        self.should_stop = False
        self.diag = type("Diag", (), {"set_flag": lambda *_: None, "unset_flag": lambda *_: None})()
        self.app = type("App", (), {"topics": type("T", (), {"acks_enabled_for": lambda *_: True})()})()

    def __getattr__(self, name: str) -> Any:
        raise AttributeError(name)

    async def callback(self, m: Msg) -> None:
        self.callback_got.append((m.topic, m.offset))

    async def getmany(self, timeout: float) -> AsyncIterator[tuple[TP, Msg]]:
        if not self._fetches:
            self._fetcher._stopped.set()
            return
        for m in self._fetches.pop(0):
            yield m.tp, m

    async def sleep(self, _s: float) -> None:
        await asyncio.sleep(0)

    async def wait_first(self, *aws: Any) -> None:
        await aws[0]
        aws[1].close()

    async def _add_gap(self, tp: TP, start: int, end: int) -> None:
        self.gaps.append((tp, start, end))


def test_the_fetch_loop_hands_a_fetch_over_in_one_call_and_keeps_fausts_offsets_and_gaps() -> None:
    async def main() -> tuple[FakeConsumer, list[list[int]]]:
        d = BatchDelivery("ev")
        calls: list[list[int]] = []
        real = d.deliver

        async def deliver(ms: list[Any], c: Any) -> None:
            calls.append([m.offset for m in ms])
            await real(ms, c)

        d.deliver = deliver  # type: ignore[method-assign]
        fetcher = FakeFetcher()
        fetches = [
            msgs("ev", 0, [0, 1, 2]) + msgs("other", 0, [7]) + msgs("ev", 1, [0]),
            msgs("ev", 0, [1, 2, 3]) + msgs("ev", 0, [6]),  # 1 below the read offset (2); 4-5 a gap
        ]
        fake = FakeConsumer(fetches, {"ev": d}, fetcher)
        await BatchConsumer._drain_messages(fake, fetcher)  # type: ignore[arg-type]
        return fake, calls

    fake, calls = asyncio.run(main())
    # one hand-over per fetch; as in Faust, a record below the partition's read offset is dropped
    assert calls == [[0, 1, 2, 0], [2, 3, 6]]
    assert fake.callback_got == [("other", 7)]  # other topics keep Faust's per-record path
    assert fake.gaps == [(TP("ev", 0), 4, 6)]
    assert fake._read_offset == {TP("ev", 0): 6, TP("ev", 1): 0, TP("other", 0): 7}


def test_the_projector_app_consumes_its_events_topic_through_a_batch_consumer(
        monkeypatch: pytest.MonkeyPatch) -> None:
    settings = Settings.from_env().with_(topic_prefix="unit-batches.", metrics_port=0)
    app = build_app(settings, ProjectorOptions(app_id="unit-batches"))
    assert isinstance(app, faust.App)
    consumer_cls = app.transport.Consumer
    assert issubclass(consumer_cls, BatchConsumer)
    assert list(consumer_cls.deliveries) == ["unit-batches.runlog.events"]
    assert "unit-batches.runlog.events" in {t for topic in app.topics for t in topic.topics}


def test_install_gives_each_app_its_own_topics() -> None:
    a = faust.App("unit-a", broker="kafka://127.0.0.1:1", autodiscover=False)
    b = faust.App("unit-b", broker="kafka://127.0.0.1:1", autodiscover=False)
    install(a, [BatchDelivery("ta")])
    install(b, [BatchDelivery("tb")])
    assert list(a.transport.Consumer.deliveries) == ["ta"]
    assert list(b.transport.Consumer.deliveries) == ["tb"]


def _fetch_settings(app: faust.App, monkeypatch: pytest.MonkeyPatch) -> tuple[int, int]:
    """The fetch settings of the aiokafka consumer that ``app``'s consumer thread makes: Faust's own
    making of it returns a real aiokafka consumer (made on a loop, as aiokafka requires; never started,
    so nothing connects), which the thread's override then sets."""
    thread_cls = app.transport.Consumer.thread_class
    assert issubclass(thread_cls, BatchConsumerThread)

    async def make() -> tuple[int, int]:
        made = aiokafka.AIOKafkaConsumer(bootstrap_servers="127.0.0.1:1", group_id="g")
        monkeypatch.setattr(faust_aiokafka.AIOKafkaConsumerThread, "_create_worker_consumer",
                            lambda self, transport: made)
        aio = object.__new__(thread_cls)._create_worker_consumer(app.transport)
        assert aio is made
        try:
            return aio._fetch_min_bytes, aio._fetch_max_wait_ms
        finally:
            await aio.stop()

    return asyncio.run(make())


def test_the_projectors_kafka_consumer_fetches_with_its_fetch_settings(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Faust lets an app choose neither fetch setting (a fetch answered at its first byte, so at a few
    thousand events a second the consumer thread fetched every few records): the worker consumer the
    projector's consumer thread makes has the options' values, which aiokafka's start hands its fetcher."""
    settings = Settings.from_env().with_(topic_prefix="unit-fetch.", metrics_port=0)
    app = build_app(settings, ProjectorOptions(app_id="unit-fetch", fetch_min_bytes=4096, fetch_wait_ms=7))
    assert _fetch_settings(app, monkeypatch) == (4096, 7)
    d = ProjectorOptions()
    assert (d.fetch_min_bytes, d.fetch_wait_ms) == (65_536, 10)
    default = build_app(settings, ProjectorOptions(app_id="unit-fetch-2"))
    assert _fetch_settings(default, monkeypatch) == (65_536, 10)
    # an app installed without them keeps what Faust gives aiokafka (1 byte, 1,500 ms)
    plain = faust.App("unit-plain", broker="kafka://127.0.0.1:1", autodiscover=False)
    install(plain, [BatchDelivery("tp")])
    assert _fetch_settings(plain, monkeypatch) == (1, 1500)
