"""The schema log when the broker does not say whether the schemas topic exists: the writer schema is
not marked published (it was, and then never published in that process); writers go on without waiting,
and a thread of the log asks again and publishes every schema first used meanwhile."""

from __future__ import annotations

import threading
import time
from types import SimpleNamespace
from typing import Any

import pytest

from runlog.schemas import Settings, _schema_log
from runlog.schemas._schema_log import SchemaLog


def _own(topic: str) -> bool:
    """Whether ``topic`` is the schemas topic of these tests' logs (``_log``'s). Another test's log in
    this process (an integration test's, under its own prefix) may still be asking for its topic on its
    retry thread, and would meet the stand-ins below: they answer only these tests' topic, so that
    thread neither counts as an ask nor publishes into ``sent``."""
    return topic == SchemaLog(Settings()).topic


class _Admin:
    """An AdminClient whose metadata request fails the first ``fails`` times, then lists the topic
    (or lists none when ``topic`` is false)."""

    asks = 0
    fails = 1
    topic = True

    def __init__(self, _conf: dict[str, Any]) -> None:
        pass

    def list_topics(self, topic: str, timeout: float) -> Any:
        if not _own(topic):
            raise RuntimeError(f"{topic} is another test's")
        type(self).asks += 1
        if type(self).asks <= type(self).fails:
            raise RuntimeError("no answer")
        found = {topic: SimpleNamespace(error=None, partitions={0: object()})} if type(self).topic else {}
        return SimpleNamespace(topics=found)


@pytest.fixture
def admin(monkeypatch: pytest.MonkeyPatch) -> type[_Admin]:
    import confluent_kafka.admin

    class Admin(_Admin):
        pass

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", Admin)
    monkeypatch.setattr(_schema_log, "_REASK_S", 0.2)
    return Admin


def _log(monkeypatch: pytest.MonkeyPatch) -> tuple[SchemaLog, list[bytes]]:
    """A log whose producer is a stand-in that acknowledges every record (the fingerprints it was
    given, in ``sent``)."""
    import confluent_kafka

    sent: list[bytes] = []
    lock = threading.Lock()

    class Producer:
        def __init__(self, _conf: dict[str, Any]) -> None:
            self.reports: list[Any] = []

        def produce(self, topic: str, *, key: bytes, value: bytes, headers: Any, on_delivery: Any) -> None:
            if _own(topic):  # not another test's log still retrying
                with lock:
                    sent.append(bytes.fromhex(key.decode()))
            self.reports.append(on_delivery)

        def flush(self, _timeout: float) -> int:
            for report in self.reports:
                report(None, None)
            self.reports.clear()
            return 0

    monkeypatch.setattr(confluent_kafka, "Producer", Producer)
    return SchemaLog(Settings()), sent


def _until(check: Any, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_schemas_first_used_while_the_broker_does_not_answer_are_published_when_it_does(
        admin: type[_Admin], monkeypatch: pytest.MonkeyPatch) -> None:
    admin.fails = 3
    log, sent = _log(monkeypatch)
    one, two = b"\x01" * 8, b"\x02" * 8
    log.publish("runlog.RunEvent", one, {"type": "record"})  # the ask fails: nothing published yet
    assert (admin.asks, sent) == (1, [])
    t0 = time.monotonic()
    log.publish("runlog.Checkpoint", two, {"type": "record"})  # meanwhile: neither asked nor waited for
    assert time.monotonic() - t0 < 0.1 and admin.asks == 1
    assert _until(lambda: sorted(sent) == [one, two]), (admin.asks, sent)
    assert admin.asks == 4  # asked again until it answered (two more failures, then the topic)
    log.publish("runlog.RunEvent", one, {"type": "record"})  # published: not again
    assert sorted(sent) == [one, two]


def test_without_the_topic_the_pending_schemas_are_dropped_once_the_broker_answers(
        admin: type[_Admin], monkeypatch: pytest.MonkeyPatch) -> None:
    admin.topic = False
    log, sent = _log(monkeypatch)
    log.publish("runlog.RunEvent", b"\x01" * 8, {"type": "record"})
    assert _until(lambda: admin.asks == 2)
    assert _until(lambda: log._retrying is None)
    for fp in (b"\x01" * 8, b"\x02" * 8):  # the topic is known missing: not asked again
        log.publish("runlog.RunEvent", fp, {"type": "record"})
    assert (admin.asks, sent) == (2, [])
