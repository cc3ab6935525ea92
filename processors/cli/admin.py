"""``runlog init`` and ``runlog doctor``: create the topics, check the services."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK, EXIT_UNAVAILABLE
from runlog.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "init",
        help="create Runlog's topics (a no-op when they exist with the right config)",
        description=(
            "Create the events, checkpoints, effects, resume, streams, dead-letter and schemas topics, and "
            "publish every bundled writer schema on the schemas topic (docs/how-to/upgrade-runlog.md). "
            "Existing topics are checked; a conflicting setting is reported and the "
            "command exits 1 without changing anything."
        ),
    )
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_init)
    d = sub.add_parser(
        "doctor",
        help="check Kafka, Redis and the topics; exit non-zero when something is wrong",
        description="Report broker and Redis reachability, versions and topic configs. Open runs "
        "whose workflow@version no live resumer member serves (runlog versions) are warnings: "
        "printed, not failures.",
    )
    d.add_argument("--json", action="store_true", help="print one JSON object")
    d.set_defaults(func=_doctor)
    register_smoke(sub)


def _report_dict(r: Any) -> dict[str, Any]:
    return {
        "topic": r.name,
        "action": r.action,
        "partitions": r.partitions,
        "replication_factor": r.replication_factor,
        "conflicts": [
            {"setting": c.setting, "expected": c.expected, "actual": c.actual} for c in r.conflicts
        ],
    }


def _init(args: argparse.Namespace) -> int:
    from runlog.processors.admin import ServiceUnavailable, ensure_topics, probe_kafka

    settings = Settings.from_env()
    try:
        probe_kafka(settings)  # a broker that does not answer: told in 10 s, not after the topics' 30 s
        reports = ensure_topics(settings)
    except ServiceUnavailable as err:
        print(f"runlog init: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    bad = [r for r in reports if r.action != "ok" and r.action != "created"]
    if args.json:
        print(json.dumps({"ok": not bad, "topics": [_report_dict(r) for r in reports]}))
    else:
        for r in reports:
            print(f"{r.action:9} {r.name}")
            for c in r.conflicts:
                print(f"          {c.setting}: is {c.actual!r}, Runlog needs {c.expected!r}")
        if bad:
            print("runlog init: existing topics conflict with Runlog's settings; "
                  "nothing was changed", file=sys.stderr)
    return EXIT_FOUND if bad else EXIT_OK


def _doctor(args: argparse.Namespace) -> int:
    from runlog.processors.admin import (
        RedisModeMismatch,
        ServiceUnavailable,
        check_kafka,
        check_redis,
        ensure_topics,
    )

    settings = Settings.from_env()
    out: dict[str, Any] = {"settings": settings.redacted(), "ok": True}
    try:
        out["kafka"] = check_kafka(settings)
    except ServiceUnavailable as err:
        out["kafka"] = {"error": str(err)}
        out["ok"] = False
    try:
        out["redis"] = check_redis(settings)
    except RedisModeMismatch as err:  # it answered, but the URL's mode is wrong: a problem, not an outage
        out["redis"] = {"problem": str(err)}
        out["ok"] = False
    except ServiceUnavailable as err:
        out["redis"] = {"error": str(err)}
        out["ok"] = False
    if settings.schema_registry_url:
        from runlog.schemas import Codec
        from runlog.schemas.errors import ConfigError

        try:
            Codec.from_settings(settings)  # asks the registry, as every reader and writer does first
            out["registry"] = {"ok": True}
        except ConfigError as err:  # unreachable, or refusing the credentials
            out["registry"] = {"error": str(err)}
            out["ok"] = False
    out["warnings"] = []
    if "error" not in out["redis"] and "problem" not in out["redis"]:
        out["versions"] = _versions_check(settings)
        out["warnings"] += out["versions"].get("warnings", [])
    if "error" not in out["kafka"]:
        reports = ensure_topics(settings, create=False)
        out["topics"] = [_report_dict(r) for r in reports]
        if any(r.action != "ok" for r in reports):
            out["ok"] = False
    if args.json:
        print(json.dumps(out, default=str))
    else:
        k, r = out["kafka"], out["redis"]
        print(f"kafka   {settings.kafka_bootstrap_servers}: "
              + (f"ERROR {k['error']}" if "error" in k else
                 f"ok, cluster {k['cluster_id']}, brokers {', '.join(k['brokers'])}"))
        print(f"redis   {settings.redacted()['redis_url']}: "
              + (f"ERROR {r['error']}" if "error" in r else f"PROBLEM {r['problem']}" if "problem" in r else
                 f"ok, version {r['redis_version']} ({r['redis_mode']}), "
                 f"aof {'on' if r['aof_enabled'] else 'off'}"
                 + (f", cluster_state {r['cluster_state']}, {r['cluster_size']} masters, "
                    f"{r['cluster_known_nodes']} nodes" if r.get("redis_mode") == "cluster" else "")))
        if "registry" in out:
            g = out["registry"]
            print(f"registry {settings.redacted()['schema_registry_url']}: "
                  + (f"ERROR {g['error']}" if "error" in g else "ok"))
        for t in out.get("topics", []):
            status = t["action"]
            extra = f" partitions={t['partitions']} rf={t['replication_factor']}" \
                if status != "missing" else ""
            print(f"topic   {t['topic']}: {status}{extra}")
            for c in t["conflicts"]:
                print(f"        {c['setting']}: is {c['actual']!r}, needs {c['expected']!r}")
        v = out.get("versions")
        if v is not None:
            print("versions " + (f"not checked: {v['note']}" if not v["checked"] else
                                 f"{v['open']} open runs of {v['versions']} workflow versions, "
                                 f"{len(v['unserved'])} with no live member"))
        for w in out["warnings"]:
            print(f"warning: {w}")
        n = len(out["warnings"])
        print("doctor: problems found" if not out["ok"] else "doctor: all good" if not n else
              f"doctor: no problems, {n} warning{'s' * (n != 1)} (not failures: exit 0)")
    if "error" in out["kafka"] or "error" in out["redis"] or "error" in out.get("registry", {}):
        return EXIT_UNAVAILABLE
    return EXIT_OK if out["ok"] else EXIT_FOUND


def _versions_check(settings: Settings) -> dict[str, Any]:
    """Whether every open run's ``workflow@version`` has a live member (``runlog versions``): a
    warning per version that has none, naming it and its open runs; not checked while the projection
    is not ready (its counts are not the truth then)."""
    import redis

    from runlog.processors.cli.versions import read_versions
    from runlog.schemas.errors import RunlogError

    try:
        rows, note = read_versions(settings, log_fallback=False)
    except (redis.RedisError, RunlogError) as err:
        return {"checked": False, "note": f"reading Redis failed: {err}", "warnings": []}
    if note is not None:
        return {"checked": False, "note": note, "warnings": []}
    unserved = [r for r in rows if r.unserved]
    return {"checked": True, "versions": len(rows), "open": sum(r.open for r in rows),
            "unserved": [{"version": r.label, "open": r.open, "runs": {s: n for s, n in r.runs.items() if n},
                          "parked": r.waiting} for r in unserved],
            "warnings": [f"{r.problem()} (runlog versions)" for r in unserved]}


def register_smoke(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser(
        "smoke",
        help="Avro RunEvents through the broker and back, on a private topic it deletes after",
        description=(
            "A round trip through the real broker: create a private events topic "
            "(<topic prefix>smoke-<tag>.runlog.events, with the events topic's partitions, "
            "replication and min.insync.replicas), produce with the writers' config, consume, "
            "decode, compare, then delete the topic. Runlog's own topics get no record and "
            "Redis is not written. Exit 0 equal, 1 a difference, an unacknowledged append or "
            "a topic left behind, 2 a topic the cluster refuses, 3 Kafka unreachable."
        ),
    )
    s.add_argument("--runs", type=int, default=5, metavar="N",
                   help="two-event runs produced and read back (default: %(default)s)")
    s.set_defaults(func=_smoke)


def smoke_settings(settings: Settings, tag: str) -> Settings:
    """Where ``runlog smoke`` writes: its own topic prefix under the configured one (so topic ACLs
    by prefix still allow it) and its own Redis prefix, never Runlog's real topics or keys."""
    return settings.with_(topic_prefix=f"{settings.topic_prefix}smoke-{tag}.",
                          redis_prefix=f"{settings.redis_prefix}:smoke-{tag}")


def _smoke(args: argparse.Namespace) -> int:
    import uuid

    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    from runlog.processors.admin import admin_client, probe_kafka
    from runlog.schemas import Topics
    from runlog.schemas.errors import ConfigError
    from runlog.schemas.internal import awaited

    tag = uuid.uuid4().hex[:8]
    settings = smoke_settings(Settings.from_env(), tag)
    probe_kafka(settings)  # unreachable: exit 3 within 10 s (ServiceUnavailable), not a minute later
    spec = Topics.of(settings).specs(settings)[0]  # the events topic's shape, under the private prefix
    topic = spec.name
    admin = admin_client(settings)
    config = {**spec.config, "retention.ms": str(3_600_000)}  # should the delete fail, an hour at most
    try:
        awaited(admin, admin.create_topics([NewTopic(topic, num_partitions=spec.partitions,
                                                     replication_factor=spec.replication_factor,
                                                     config=config)], operation_timeout=30)[topic], 60)
    except KafkaException as err:
        kerr = err.args[0] if err.args else None
        if isinstance(kerr, KafkaError) and kerr.code() in (
                KafkaError.INVALID_REPLICATION_FACTOR, KafkaError.POLICY_VIOLATION,
                KafkaError.INVALID_CONFIG, KafkaError.TOPIC_AUTHORIZATION_FAILED):
            raise ConfigError(f"smoke: cannot create its topic {topic!r}: {kerr.str()}") from err
        print(f"smoke: creating its topic {topic!r} failed: {err}", file=sys.stderr)
        return EXIT_UNAVAILABLE
    try:
        ok, line = _smoke_round_trip(settings, topic, tag, args.runs)
    finally:
        try:
            admin.delete_topics([topic], operation_timeout=30)[topic].result(60)
            deleted = True
        except KafkaException as err:
            print(f"smoke: deleting its topic {topic!r} failed: {err}; delete it by hand",
                  file=sys.stderr)
            deleted = False
    if line:
        print(f"{line}; topic {'deleted' if deleted else 'LEFT BEHIND'}")
    return EXIT_OK if ok and deleted else EXIT_FOUND


def _smoke_round_trip(settings: Settings, topic: str, tag: str, runs: int) -> tuple[bool, str]:
    """Produce ``runs`` two-event runs to ``topic``, read them back by position, compare: (equal,
    the line to print, empty when appends were not acknowledged)."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    from runlog.schemas import Codec, EventType, RunEvent, now_ms

    codec = Codec.from_settings(settings, schema_log=False)  # a round trip: no schema to publish anywhere
    producer = Producer(settings.producer_config())
    sent = [
        RunEvent(f"smoke-{tag}-{i}", seq, 1, t, now_ms(), attributes={"smoke": tag})
        for i in range(runs)
        for seq, t in enumerate((EventType.RUN_STARTED, EventType.RUN_COMPLETED), start=1)
    ]
    positions: list[tuple[int, int]] = []
    errors: list[str] = []

    def on_delivery(err: Any, msg: Any) -> None:
        if err is None:
            positions.append((msg.partition(), msg.offset()))
        else:
            errors.append(str(err))

    for ev in sent:
        producer.produce(topic, key=ev.run_id.encode(), value=codec.encode(ev), on_delivery=on_delivery)
    producer.flush(30)
    if len(positions) != len(sent):
        print(f"smoke: only {len(positions)} of {len(sent)} events acknowledged "
              f"({errors[0] if errors else 'timeout'})", file=sys.stderr)
        return False, ""
    consumer = Consumer(settings.consumer_config(f"runlog-smoke-{tag}"))
    start: dict[int, int] = {}
    for p, o in positions:
        start[p] = min(o, start.get(p, o))
    consumer.assign([TopicPartition(topic, p, o) for p, o in start.items()])
    got = []
    wanted = set(positions)
    try:
        for _ in range(len(sent) * 20):
            msg = consumer.poll(1.0)
            if msg is None or msg.error():
                continue
            if (msg.partition(), msg.offset()) in wanted:
                got.append(codec.decode(msg.value(), RunEvent))
            if len(got) == len(sent):
                break
    finally:
        consumer.close()
    ok = sorted(got, key=lambda e: (e.run_id, e.seq)) == sorted(sent, key=lambda e: (e.run_id, e.seq))
    return ok, (f"smoke: {len(sent)} events appended to {topic}, {len(got)} read back, "
                f"{'equal' if ok else 'DIFFERENT'}")
