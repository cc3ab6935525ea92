"""The schema log when the broker does not say whether the schemas topic exists: the writer schema is
not marked published (it was, and then never published in that process), writes go on meanwhile, and
the topic is asked for again after :data:`_REASK_S`."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

import pytest

from runlog.schemas import Settings, _schema_log
from runlog.schemas._schema_log import SchemaLog


class _Admin:
    """An AdminClient whose metadata request fails the first ``fails`` times, then lists the topic."""

    asks = 0
    fails = 1

    def __init__(self, _conf: dict[str, Any]) -> None:
        pass

    def list_topics(self, topic: str, timeout: float) -> Any:
        type(self).asks += 1
        if type(self).asks <= type(self).fails:
            raise RuntimeError("no answer")
        return SimpleNamespace(topics={topic: SimpleNamespace(error=None, partitions={0: object()})})


def test_a_failed_ask_leaves_the_schema_unpublished_and_asks_again_later(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka.admin

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _Admin)
    monkeypatch.setattr(_Admin, "asks", 0)
    monkeypatch.setattr(_schema_log, "_REASK_S", 0.3)
    log = SchemaLog(Settings())
    sent: list[bytes] = []
    monkeypatch.setattr(log, "publish_all", lambda schemas: sent.extend(fp for _n, fp, _d in schemas))
    fp = b"\x01" * 8

    log.publish("runlog.RunEvent", fp, {"type": "record"})  # the ask fails: nothing published
    assert (_Admin.asks, sent) == (1, [])
    log.publish("runlog.RunEvent", fp, {"type": "record"})  # within the back-off: not asked again
    assert (_Admin.asks, sent) == (1, [])
    time.sleep(0.35)
    log.publish("runlog.RunEvent", fp, {"type": "record"})  # asked again: the topic is there
    assert (_Admin.asks, sent) == (2, [fp])


def test_a_missing_topic_is_asked_for_once(monkeypatch: pytest.MonkeyPatch) -> None:
    import confluent_kafka.admin

    class _NoTopic(_Admin):
        def list_topics(self, topic: str, timeout: float) -> Any:
            type(self).asks += 1
            return SimpleNamespace(topics={})

    monkeypatch.setattr(confluent_kafka.admin, "AdminClient", _NoTopic)
    monkeypatch.setattr(_NoTopic, "asks", 0)
    log = SchemaLog(Settings())
    sent: list[bytes] = []
    monkeypatch.setattr(log, "publish_all", lambda schemas: sent.extend(fp for _n, fp, _d in schemas))
    for fp in (b"\x01" * 8, b"\x02" * 8, b"\x01" * 8):
        log.publish("runlog.RunEvent", fp, {"type": "record"})
    assert (_NoTopic.asks, sent) == (1, [])
