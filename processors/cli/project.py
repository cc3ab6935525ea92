"""``runlog project`` (the projector) and ``runlog projections rebuild`` (replay the log into Redis)."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from runlog.schemas.settings import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "project",
        help="run the projector: fold the events topic into Redis and the compacted topics",
        description=(
            "Consume the events topic in a consumer group (scale out by starting more), fold "
            "each run's events, write Redis, publish checkpoints and effects, and send "
            "undecodable records to the dead-letter topic. Metrics on RUNLOG_METRICS_PORT. A Redis "
            "or Kafka that does not answer at start is waited for (RUNLOG_STARTUP_WAIT_MS), then exit 3."
        ),
    )
    p.add_argument("--app-id", default="runlog-projector",
                   help="Faust app id = consumer group (under RUNLOG_TOPIC_PREFIX)")
    p.add_argument("--batch-size", type=int, default=500,
                   help="events folded and written per batch at most (default: %(default)s)")
    p.add_argument("--within", type=float, default=0.0,
                   help="seconds to wait for more records when fewer than --batch-size have arrived "
                        "(default: %(default)s, apply what has arrived: under load a batch fills while the "
                        "one before is applied; a wait adds to every event's lag at low rates)")
    p.add_argument("--fetch-min-bytes", type=int, default=65_536, metavar="BYTES",
                   help="the fewest bytes of events a fetch waits for at the broker (default: %(default)s)")
    p.add_argument("--fetch-wait-ms", type=int, default=10, metavar="MS",
                   help="the longest a fetch waits for --fetch-min-bytes: what an event may wait at the "
                        "broker when fewer arrive (default: %(default)s)")
    p.add_argument("--cache-size", type=int, default=10_000, help="run states cached in memory")
    p.add_argument("--session-timeout-ms", type=int, default=30_000,
                   help="the group's session timeout: a member silent this long (dead, paused) loses its "
                        "partitions to the others (heartbeats every third of it)")
    p.add_argument("--instance-id", default=None,
                   help="static group membership (group.instance.id): a member restarted with the same id "
                        "within the session timeout gets its partitions back without a rebalance; unique "
                        "per member (e.g. the pod name). Default: RUNLOG_GROUP_INSTANCE_ID, else dynamic")
    p.set_defaults(func=_project)

    pr = sub.add_parser("projections", help="rebuild and compare the Redis projections")
    psub = pr.add_subparsers(dest="projections_command", metavar="ACTION", required=True)
    rb = psub.add_parser(
        "rebuild",
        help="replay the events topic from the beginning into a fresh Redis namespace",
        description=(
            "Read every partition of the events topic from the beginning up to the high "
            "watermarks at start (no consumer group offsets), fold it into TARGET (cleared "
            "first). --diff compares the projection keys with the live namespace (exit 1 when "
            "they differ; writers' keys such as leases are not compared). --swap makes it the "
            "live one; it refuses a target overlapping the live prefix (exit 2: equal, or one "
            "inside the other at a ':'), and a failed swap puts the live namespace back (exit 3); "
            "on Redis Cluster it moves the keys slot by slot, each slot atomically (docs/reference/redis.md)."
        ),
    )
    rb.add_argument("--target", help="Redis prefix to rebuild into (default: <prefix>:rebuild, inside the "
                                     "live prefix; with --swap the sibling <prefix>.rebuild)")
    rb.add_argument("--diff", action="store_true", help="print keys differing from the live namespace")
    rb.add_argument("--swap", action="store_true", help="make the rebuilt namespace live")
    rb.add_argument("--quiet", action="store_true", help="no progress bar")
    rb.add_argument("--json", action="store_true", help="print one JSON object")
    rb.add_argument("--workers", type=int, default=1, metavar="N",
                    help="replay in N processes, each a share of the partitions (default: %(default)s)")
    rb.set_defaults(func=_rebuild)


def _project(args: argparse.Namespace) -> int:
    from runlog.processors.projector import ProjectorOptions, run_projector

    settings = Settings.from_env()
    if args.fetch_min_bytes < 1 or args.fetch_wait_ms < 1:
        # a wait of 0 with more than a byte to wait for: a fetch loop that never rests
        print("runlog project: --fetch-min-bytes and --fetch-wait-ms must be >= 1", file=sys.stderr)
        return EXIT_USAGE
    opts = ProjectorOptions(app_id=args.app_id, batch_size=args.batch_size, within=args.within,
                            fetch_min_bytes=args.fetch_min_bytes, fetch_wait_ms=args.fetch_wait_ms,
                            cache_size=args.cache_size, session_timeout_ms=args.session_timeout_ms,
                            instance_id=args.instance_id or settings.group_instance_id)
    return run_projector(settings, opts)


def _rebuild(args: argparse.Namespace) -> int:
    from runlog.processors.admin import check_redis
    from runlog.projections.rebuild import (
        NamespaceOverlap,
        SwapFailed,
        SwapRefused,
        default_target,
        diff_namespaces,
        prefixes_overlap,
        rebuild,
        replay_into,
        swap_namespaces,
    )
    from runlog.projections.redis_store import RedisStore
    from runlog.schemas.internal import redis_client

    if args.workers < 1:
        print(f"runlog projections rebuild: --workers must be 1 or more, not {args.workers}", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings.from_env()
    check_redis(settings)  # a redis:// URL to a cluster node would rebuild into one node's slots only
    live = settings.redis_prefix
    target = args.target or default_target(settings, swap=args.swap)
    if args.swap and prefixes_overlap(live, target):
        print(f"runlog projections rebuild: {NamespaceOverlap(live, target, '--swap')}", file=sys.stderr)
        return EXIT_USAGE
    client = redis_client(settings)
    swapped: int | None = None
    try:
        try:
            report = rebuild(settings, target, progress=None if args.quiet or args.json else sys.stderr,
                             client=client, workers=args.workers)
        except NamespaceOverlap as err:
            print(f"runlog projections rebuild: {err}", file=sys.stderr)
            return EXIT_USAGE
        diff = diff_namespaces(client, live, target) if args.diff else []
        if args.swap:
            def catch_up(hold: Callable[[], None]) -> None:
                # events the live projectors applied after the rebuild read its high watermarks
                replay_into(settings, RedisStore(client, target), on_batch=hold,
                            from_offsets=report.high_watermarks)

            try:
                swapped = swap_namespaces(client, live, target, catch_up=catch_up)
            except SwapRefused as err:
                print(f"runlog projections rebuild: --swap refused: {err}", file=sys.stderr)
                return EXIT_FOUND
            except SwapFailed as err:
                print(f"runlog projections rebuild: {err}", file=sys.stderr)
                return EXIT_UNAVAILABLE
    finally:
        client.close()
    if args.json:
        print(json.dumps({"target": target, "records": report.records, "applied": report.applied,
                          "rejected": report.rejected, "dead_letters": report.dead_letters,
                          "seconds": round(report.seconds, 3), "differing_keys": diff,
                          "swapped_keys": swapped}))
    else:
        print(f"rebuilt {target}: {report.records} records, {report.applied} applied, "
              f"{report.rejected} rejected, {report.dead_letters} undecodable, {report.seconds:.1f}s")
        for k in diff:
            print(f"differs {k}")
        if args.diff:
            print(f"{len(diff)} keys differ from {live}")
        if swapped is not None:
            print(f"swapped {swapped} keys into {live}")
    return EXIT_FOUND if diff else EXIT_OK
