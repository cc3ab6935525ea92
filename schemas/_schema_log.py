"""The schema log: writer schemas published on the compacted ``<prefix>runlog.schemas`` topic, keyed
by the hex of their single-object fingerprint, so a reader that meets a fingerprint it does not know
(a record written by a newer Runlog) finds the writer schema there before it dead-letters the record.

``runlog init`` publishes every bundled schema (current and past); a writer publishes the schema it
writes a record with before its first record of that kind (once per process and fingerprint). A
record's value is the schema's JSON (a self-contained Avro schema any library parses), with the
header ``runlog.record`` naming the record. No connection is made until one is needed: a codec of a
process that writes nothing and meets only known fingerprints never touches the topic.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from typing import Any

from runlog.schemas.errors import LogUnavailable
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["SchemaLog", "publish_bundled_schemas"]

log = logging.getLogger("runlog.schemas.schema_log")

_LOCK = threading.Lock()
_LOGS: dict[tuple[Any, ...], SchemaLog] = {}
_REREAD_S = 1.0
"""A fingerprint not found is looked up on the topic again only after this long (a stream of
records of an unknown schema reads the topic once a second at most, not once per record)."""
_REASK_S = 30.0
"""After the broker did not say whether the schemas topic exists, a thread of the log asks again this
often and publishes the writer schemas first used meanwhile; writers go on without waiting."""


class SchemaLog:
    """The schemas topic of one cluster and prefix, shared by every codec of a process (:meth:`of`).

    Args:
        settings: the cluster (and its client settings) and the topic prefix.
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.topic = Topics.of(settings).schemas
        self._published: set[bytes] = set()
        self._known: dict[bytes, dict[str, Any]] = {}
        self._read_at = 0.0
        self._exists: bool | None = None
        self._pending: dict[bytes, tuple[str, dict[str, Any]]] = {}  # first used while not known
        self._retrying: threading.Thread | None = None
        self._producer: Any = None
        self._lock = threading.Lock()

    @classmethod
    def of(cls, settings: Settings) -> SchemaLog:
        """The process's schema log for ``settings``' cluster, client settings and topic prefix."""
        key = (settings.kafka_bootstrap_servers, settings.topic_prefix,
               tuple(sorted(settings.kafka_extra.items())))
        with _LOCK:
            found = _LOGS.get(key)
            if found is None:
                found = _LOGS[key] = cls(settings)
            return found

    # -- writing -------------------------------------------------------------------------------

    def publish(self, record_name: str, fingerprint: bytes, schema: dict[str, Any]) -> None:
        """Put ``schema`` on the topic under ``fingerprint`` (once per process), acknowledged before
        this returns, so a reader that sees a record written with it finds it. Without the topic
        (created by ``runlog init`` of a Runlog that predates it) a warning is logged once and
        nothing is published. When the broker does not say whether the topic exists (an outage at
        the first use), this returns after that one ask (up to 5 s) and a thread of the log asks
        again every :data:`_REASK_S` and publishes every schema first used meanwhile: a writer
        does not wait for the broker's return, and its schemas are not left unpublished.

        Raises:
            LogUnavailable: the broker did not acknowledge it.
        """
        if fingerprint in self._published:
            return
        with self._lock:
            if fingerprint in self._published:
                return
            if self._retrying is not None:  # the topic is being asked for again: published then
                self._pending[fingerprint] = (record_name, schema)
                return
            exists = self._topic_exists()
            if exists is None:
                self._pending[fingerprint] = (record_name, schema)
                self._retrying = threading.Thread(target=self._retry, name="runlog-schema-log", daemon=True)
                self._retrying.start()
                return
            if not exists:
                self._published.add(fingerprint)
                return
            self.publish_all([(record_name, fingerprint, schema)])

    def publish_all(self, schemas: list[tuple[str, bytes, dict[str, Any]]]) -> int:
        """Put every ``(record name, fingerprint, schema)`` on the topic; returns how many.

        Raises:
            LogUnavailable: the broker did not acknowledge them.
        """
        from confluent_kafka import Producer

        if self._producer is None:
            self._producer = Producer(self.settings.producer_config(**{"linger.ms": 0}))
        errors: list[str] = []

        def delivered(err: Any, _msg: Any) -> None:
            if err is not None:
                errors.append(str(err))

        for name, fp, doc in schemas:
            self._producer.produce(self.topic, key=fp.hex().encode(), value=json.dumps(doc).encode("utf-8"),
                                   headers=[("runlog.record", name.encode())], on_delivery=delivered)
        left = self._producer.flush(30)
        if left or errors:
            raise LogUnavailable(f"publishing writer schemas on {self.topic} failed: "
                                 f"{errors[0] if errors else f'{left} not acknowledged in 30 s'}")
        for _name, fp, doc in schemas:
            self._published.add(fp)
            self._known[fp] = doc
        return len(schemas)

    def _retry(self) -> None:
        """Ask whether the topic exists every :data:`_REASK_S` until the broker says, then publish
        the pending schemas (or drop them: no topic); a publish the broker does not acknowledge is
        tried again at the next round. Outside the log's lock: while this thread runs, writers only
        add to the pending schemas, and only this thread asks and publishes."""
        wait = True
        while True:
            if wait:
                time.sleep(_REASK_S)
            exists = self._topic_exists()
            if exists is None:
                continue
            with self._lock:
                pending = [(name, fp, doc) for fp, (name, doc) in self._pending.items()]
            if exists:
                try:
                    self.publish_all(pending)
                except LogUnavailable as err:
                    log.warning("%s (tried again in %.0f s)", err, _REASK_S)
                    wait = True
                    continue
            else:
                self._published.update(fp for _n, fp, _d in pending)
            log.info("the schemas topic %s answered: %d writer schema(s) first used meanwhile %s",
                     self.topic, len(pending), "published" if exists else "left unpublished (no topic)")
            with self._lock:
                for _n, fp, _d in pending:
                    self._pending.pop(fp, None)
                if self._pending:  # first used while this round published: another round, now
                    wait = False
                    continue
                self._retrying = None
                return

    def _topic_exists(self) -> bool | None:
        """Whether the schemas topic exists (asked until the broker says); None when it did not."""
        if self._exists is None:
            from confluent_kafka.admin import AdminClient

            from runlog.schemas._kafka_auth import served

            admin = AdminClient(self.settings.admin_config())
            try:
                md = served(admin, lambda t: admin.list_topics(self.topic, timeout=t), 5)
            except Exception as err:  # noqa: BLE001 - no answer: the record's own write reports the outage
                log.warning("the schemas topic %s could not be asked for (asked again every %.0f s): %s",
                            self.topic, _REASK_S, err)
                return None
            t = md.topics.get(self.topic)
            self._exists = t is not None and t.error is None and bool(t.partitions)
            if not self._exists:
                log.warning("the schemas topic %s does not exist (run `runlog init`): writer schemas are "
                            "not published, so a reader of an older Runlog cannot look them up", self.topic)
        return self._exists

    # -- reading -------------------------------------------------------------------------------

    def lookup(self, fingerprint: bytes) -> dict[str, Any] | None:
        """The schema published under ``fingerprint``, or None. Reads the whole topic (compacted: one
        record per schema) when the fingerprint is not known yet, at most once a second."""
        found = self._known.get(fingerprint)
        if found is not None:
            return found
        with self._lock:
            found = self._known.get(fingerprint)
            if found is None and time.monotonic() - self._read_at >= _REREAD_S:
                self._read_all()
                found = self._known.get(fingerprint)
            return found

    def _read_all(self) -> None:
        from confluent_kafka import Consumer, TopicPartition

        from runlog.schemas._kafka import watermarks

        self._read_at = time.monotonic()
        consumer = Consumer(self.settings.consumer_config(
            f"runlog-schema-log-{uuid.uuid4().hex[:8]}", **{"enable.partition.eof": False}))
        try:
            try:
                marks = watermarks(consumer, self.topic, timeout=10)
            except Exception as err:  # noqa: BLE001 - no topic, or no answer: nothing to find there
                log.warning("reading the schemas topic %s failed: %s", self.topic, err)
                return
            todo = {p: high for p, (low, high) in marks.items() if high > low}
            if not todo:
                return
            consumer.assign([TopicPartition(self.topic, p, marks[p][0]) for p in todo])
            deadline = time.monotonic() + 30
            while todo and time.monotonic() < deadline:
                for msg in consumer.consume(500, timeout=0.5):
                    if msg.error() is not None:
                        continue
                    self._take(msg.value())
                    if msg.offset() + 1 >= todo.get(msg.partition(), 0):
                        todo.pop(msg.partition(), None)
        finally:
            consumer.close()

    def _take(self, value: bytes | None) -> None:
        from runlog.schemas._avsc import writer_for

        if not value:
            return
        try:
            doc = json.loads(value)
            self._known[writer_for(doc).fingerprint] = doc
        except Exception:  # noqa: BLE001 - a record that is no schema teaches nothing
            return


def publish_bundled_schemas(settings: Settings) -> int:
    """Publish every bundled schema (each record's current and past versions) that the schemas
    topic does not hold yet (``runlog init``); returns how many were published.

    Raises:
        LogUnavailable: the broker did not acknowledge them.
    """
    from runlog.schemas._avsc import RECORD_FILES, load_past_schemas, load_schema, writer_for

    sl = SchemaLog.of(settings)
    with sl._lock:
        sl._read_all()
        todo = []
        for name in RECORD_FILES:
            for doc in [*load_past_schemas(name), load_schema(name)]:
                fp = writer_for(doc).fingerprint
                if fp not in sl._known:
                    todo.append((name, fp, doc))
        return sl.publish_all(todo) if todo else 0
