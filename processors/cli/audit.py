"""``runlog audit``: replay the events topic and check it."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK, EXIT_UNAVAILABLE, EXIT_USAGE
from runlog.schemas import ConfigError, Settings


def _time_ms(text: str) -> int:
    if text.isdigit():
        return int(text)
    try:
        dt = datetime.fromisoformat(text)
    except ValueError:
        raise ConfigError(f"not a time: {text!r} (ISO 8601, or epoch milliseconds)") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return int(dt.timestamp() * 1000)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "audit",
        help="replay the events topic and check every run's history (exit 1 on findings)",
        description=(
            "Replay the events topic (all of it, one run, an offset range or a time range) with a "
            "fresh consumer that commits nothing and touches no live state, fold every run, and "
            "check: rejected events (fenced writers, seq gaps), the hash chain, checkpoint "
            "artifacts, effect intents left open by finished runs, effects executed twice, and "
            "each run's chain against the anchors the projection holds in Redis (the last seq and "
            "hash it accepted: a cut tail, a lost run or an edited last event). Writes audit.json "
            "and a self-contained audit.html to --out."
        ),
        epilog="Exit status: 0 no findings, 1 findings, 2 bad usage, 3 services unreachable (Redis: "
               "--no-anchors audits the topic alone).",
    )
    p.add_argument("--run", dest="run_id", help="audit only this run (reads only its partition)")
    p.add_argument("--from-offset", type=int, help="first offset read on each partition (inclusive)")
    p.add_argument("--to-offset", type=int, help="stop before this offset on each partition (exclusive)")
    p.add_argument("--since", help="first record time (ISO 8601 or epoch ms)")
    p.add_argument("--until", help="last record time (ISO 8601 or epoch ms, inclusive)")
    p.add_argument("--no-artifacts", action="store_true", help="skip checking checkpoint artifacts")
    p.add_argument("--no-anchors", action="store_true",
                   help="do not read the projection's anchors from Redis: the topic alone (a cut tail, "
                        "a lost run or an edited last event go unseen)")
    p.add_argument("--out", default=".runlog/reports/audit", help="report directory (default: %(default)s)")
    p.add_argument("--json", action="store_true",
                   help="print one summary object {runs, events, rejected_events, findings}")
    p.add_argument("--workers", type=int, default=1, metavar="N",
                   help="read and fold in N processes, each a share of the partitions; the report is the "
                        "same as one process's (default: %(default)s)")
    p.set_defaults(func=_audit)


def _audit(args: argparse.Namespace) -> int:
    from runlog.processors.audit import AuditOptions, audit, write_report
    from runlog.projections import ProjectionStoreError

    for name in ("from_offset", "to_offset"):
        if getattr(args, name) is not None and getattr(args, name) < 0:
            print(f"runlog audit: --{name.replace('_', '-')} must be an offset (0 or more)", file=sys.stderr)
            return EXIT_USAGE
    if args.from_offset is not None and args.to_offset is not None and args.to_offset <= args.from_offset:
        print(f"runlog audit: --to-offset {args.to_offset} must be after --from-offset {args.from_offset} "
              "(it is exclusive)", file=sys.stderr)
        return EXIT_USAGE
    if args.workers < 1:
        print(f"runlog audit: --workers must be 1 or more, not {args.workers}", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings.from_env()
    opts = AuditOptions(
        run_id=args.run_id, from_offset=args.from_offset, to_offset=args.to_offset,
        since_ms=_time_ms(args.since) if args.since else None,
        until_ms=_time_ms(args.until) if args.until else None,
        check_artifacts=not args.no_artifacts, anchors=not args.no_anchors,
    )
    try:
        report = audit(settings, opts, progress=sys.stderr, workers=args.workers)
    except ProjectionStoreError as err:
        print(f"runlog audit: cannot read the anchors from Redis ({err}); --no-anchors audits the "
              "topic alone", file=sys.stderr)
        return EXIT_UNAVAILABLE
    if args.run_id is not None and not report.runs:
        print(f"runlog audit: no events of run {args.run_id!r} on {report.topic}"
              + ("" if not opts.ranged and opts.to_the_end else " in the range asked"), file=sys.stderr)
        return EXIT_FOUND
    jp, hp = write_report(report, args.out)
    if args.json:
        print(json.dumps({**report.summary(), "report_json": str(jp), "report_html": str(hp)}))
    else:
        print(f"audit of {report.topic}: {len(report.runs)} runs, {report.events} events, "
              f"{report.rejected_events} rejected, {len(report.findings)} findings")
        counts = report.anchor_counts()
        print("anchors: " + ("not checked (--no-anchors)" if counts is None else
                             ", ".join(f"{n} {k.replace('_', ' ')}" for k, n in counts.items()) or "no runs"))
        if report.erased:
            print(f"erased: {len(report.erased)} runs (subject erased; payloads destroyed, chains verified): "
                  + ", ".join(report.erased))
        for f in report.findings:
            seq = f" seq {f.seq}" if f.seq is not None else ""
            print(f"  {f.kind:<20} {f.run_id}{seq}: {f.detail}")
        print(f"report: {hp} ({jp})")
    return EXIT_FOUND if report.findings else EXIT_OK
