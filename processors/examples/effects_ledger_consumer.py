"""Example: another service follows the effects ledger topic with plain confluent-kafka and fastavro.

Nothing of Runlog is imported: the consumer reads Runlog's Avro contract, the
self-contained ``schemas/avro/effect.avsc`` (``--schema``; by default the file
beside this package, in the repository or the installed distribution), by path
with fastavro. The topic ``<prefix>runlog.effects`` is compacted and keyed
by delivery key; each value is one ``runlog.Effect`` record in Avro
single-object encoding (``C3 01``, the 8-byte little-endian CRC-64-AVRO
fingerprint of the writer schema, the body) or, when Runlog writes through a
Schema Registry, in the registry's framing (``00`` + 4-byte schema id + body;
pass ``--registry-url``). The latest record of a key is the effect's state; a
null value (tombstone) removes it.

Delivery semantics: read-only, at-least-once and idempotent. The consumer is
assigned every partition from the beginning (a compacted topic is a table:
a service rebuilds it by reading it whole), commits nothing, and applies
records by key, so reading a record twice changes nothing. Once it has reached
the high watermarks it saw at start it reports "caught up" and keeps following
new records (or exits, with ``--exit-when-caught-up``).

    python processors/examples/effects_ledger_consumer.py --bootstrap 127.0.0.1:19092 \\
        --topic runlog.effects --exit-when-caught-up --json [--schema path/to/effect.avsc]

(run by path it loads no Runlog module at all; ``python -m
runlog.processors.examples.effects_ledger_consumer``
works too, but imports the ``runlog`` package first).
"""

from __future__ import annotations

import argparse
import io
import json
import struct
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import fastavro
from confluent_kafka import Consumer, KafkaError, TopicPartition
from fastavro.schema import fingerprint, to_parsing_canonical_form

__all__ = ["EFFECT_SCHEMA", "EffectsLedger", "follow", "main"]

EFFECT_SCHEMA = Path(__file__).resolve().parents[2] / "schemas" / "avro" / "effect.avsc"
"""Runlog's ``runlog.Effect`` schema: a self-contained ``.avsc`` file (it needs no other file)."""


def _plain_schema(doc: Any) -> Any:
    """The schema without logical types, so timestamps stay epoch-millisecond ints."""
    if isinstance(doc, list):
        return [_plain_schema(x) for x in doc]
    if isinstance(doc, dict):
        if "logicalType" in doc and doc.get("type") in ("long", "int"):
            return doc["type"]
        return {k: _plain_schema(v) for k, v in doc.items() if k != "logicalType"}
    return doc


class EffectsLedger:
    """The ledger: delivery key -> the latest ``Effect`` record as a dict."""

    def __init__(self, registry_url: str | None = None, schema_path: Path = EFFECT_SCHEMA) -> None:
        doc = json.loads(schema_path.read_text(encoding="utf-8"))
        self.reader = fastavro.parse_schema(_plain_schema(doc))
        fp = fingerprint(to_parsing_canonical_form(doc), "CRC-64-AVRO")
        self.fingerprints = {bytes.fromhex(fp): self.reader}
        self.entries: dict[str, dict[str, Any]] = {}
        self.records = 0
        self._registry_url = registry_url
        self._by_id: dict[int, Any] = {}

    def _registry_schema(self, schema_id: int) -> Any:
        if schema_id not in self._by_id:
            if self._registry_url is None:
                raise ValueError(f"registry-framed record (schema id {schema_id}) and no --registry-url")
            from confluent_kafka.schema_registry import SchemaRegistryClient

            client = SchemaRegistryClient({"url": self._registry_url})
            text = client.get_schema(schema_id).schema_str or "{}"
            self._by_id[schema_id] = fastavro.parse_schema(_plain_schema(json.loads(text)))
        return self._by_id[schema_id]

    def decode(self, value: bytes) -> dict[str, Any]:
        """One ``Effect`` value of either framing."""
        if value[:2] == b"\xc3\x01":
            writer = self.fingerprints.get(value[2:10])
            if writer is None:
                raise ValueError(f"unknown writer schema fingerprint {value[2:10].hex()}")
            body = value[10:]
        elif value[:1] == b"\x00":
            writer = self._registry_schema(struct.unpack(">I", value[1:5])[0])
            body = value[5:]
        else:
            raise ValueError(f"unknown framing {value[:2].hex()}")
        record = fastavro.schemaless_reader(io.BytesIO(body), writer, self.reader)
        if not isinstance(record, dict):
            raise ValueError("not a record")
        return record

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """Apply one record: the latest value of a key wins, a tombstone deletes it."""
        self.records += 1
        if value is None:
            if key is not None:
                self.entries.pop(key.decode(), None)
            return
        rec = self.decode(value)
        self.entries[rec["delivery_key"]] = rec


def follow(bootstrap: str, topic: str, *, exit_when_caught_up: bool = False,
           on_caught_up: Callable[[EffectsLedger], None] | None = None,
           registry_url: str | None = None, extra_config: dict[str, Any] | None = None,
           schema_path: Path = EFFECT_SCHEMA) -> EffectsLedger:
    """Read the effects topic from the beginning into a ledger and keep following it."""
    conf = {"bootstrap.servers": bootstrap, "group.id": f"effects-ledger-example-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False, "auto.offset.reset": "earliest",
            "isolation.level": "read_committed", **(extra_config or {})}
    consumer = Consumer(conf)
    ledger = EffectsLedger(registry_url, schema_path)
    try:
        md = consumer.list_topics(topic, timeout=10)
        if topic not in md.topics or md.topics[topic].error is not None:
            raise SystemExit(f"topic {topic!r} not found")
        parts = sorted(md.topics[topic].partitions)
        ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts}
        behind = {p for p, e in ends.items() if e > 0}
        consumer.assign([TopicPartition(topic, p, 0) for p in parts])  # offset 0 = earliest kept
        caught_up = False
        while True:
            if not behind and not caught_up:
                caught_up = True
                if on_caught_up is not None:
                    on_caught_up(ledger)
                if exit_when_caught_up:
                    return ledger
            for m in consumer.consume(num_messages=500, timeout=1.0):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise SystemExit(f"consuming {topic!r} failed: {err}")
                ledger.apply(m.key(), m.value())
                if m.offset() >= ends[m.partition()] - 1:
                    behind.discard(m.partition())
            if behind:
                for tp in consumer.position([TopicPartition(topic, p) for p in behind]):
                    if tp.offset >= ends[tp.partition]:
                        behind.discard(tp.partition)
    finally:
        consumer.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Follow Runlog's effects ledger topic and rebuild the ledger.")
    ap.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers")
    ap.add_argument("--topic", default="runlog.effects")
    ap.add_argument("--registry-url", default=None, help="Schema Registry URL, for registry-framed values")
    ap.add_argument("--schema", type=Path, default=EFFECT_SCHEMA,
                    help=f"the runlog.Effect .avsc file (default: {EFFECT_SCHEMA})")
    ap.add_argument("--exit-when-caught-up", action="store_true")
    ap.add_argument("--json", action="store_true", help="print the ledger as one JSON object when caught up")
    args = ap.parse_args(argv)

    def report(ledger: EffectsLedger) -> None:
        if args.json:
            print(json.dumps({"records": ledger.records, "effects": ledger.entries}, sort_keys=True),
                  flush=True)
        else:
            print(f"caught up: {len(ledger.entries)} effects from {ledger.records} records", flush=True)
            for dk, e in sorted(ledger.entries.items()):
                print(f"  {dk[:16]} {e['status']:<10} {e['target']:<20} external_id={e['external_id']}")

    try:
        follow(args.bootstrap, args.topic, exit_when_caught_up=args.exit_when_caught_up,
               on_caught_up=report, registry_url=args.registry_url, schema_path=args.schema)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
