"""``runlog replay``: what recorded runs would have done with another model or other parameters
(:mod:`runlog.processors.replay`).

Exit 0 when every replay completed; 1 when one stopped at an effect it does not make or failed (the
report says where and why) or the run was refused (one line on stderr); 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import datetime
from typing import Any

from runlog.processors.cli.codes import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "replay", help="replay recorded runs with another model or parameters, in an evaluation namespace",
        description="Run a recorded run's workflow again, in an evaluation namespace of its own (topics "
        "<prefix>eval-<id>., Redis keys <redis prefix>:eval-<id>: never the live projections, ledger or "
        "topics). Calls whose position and request match the recorded run's are served their recorded "
        "results (the tool does not run); other reads run anew; model calls are made anew (with --model); "
        "an effect whose request is not the recorded one is never made: the replay stops there. Prints "
        "what changed: stage outputs, calls, tokens and cost.")
    p.add_argument("run_id", nargs="?", default=None,
                   help="the run to replay (or --workflow with --since for a cohort); `runlog replay clean` "
                        "deletes every evaluation namespace kept before (--keep)")
    p.add_argument("--app", metavar="MODULE:ATTRIBUTE",
                   help="the application (a runlog.App) registering the run's workflow version")
    p.add_argument("--model", default=None, metavar="NAME",
                   help="the model the run's agents use instead of their own (e.g. openai:gpt-5.2)")
    p.add_argument("--set", dest="set_params", action="append", default=[], metavar="PARAM=VALUE",
                   help="change a run parameter (VALUE is read as JSON, else as text); repeatable")
    p.add_argument("--workflow", default=None, metavar="NAME",
                   help="with --since and no RUN: replay every completed run of NAME started since then")
    p.add_argument("--since", default=None, metavar="TIME",
                   help="with --workflow: an ISO 8601 time (2026-12-01T00:00:00+00:00) or epoch milliseconds")
    p.add_argument("--limit", type=int, default=None, metavar="N", help="with --workflow: at most N runs")
    p.add_argument("--keep", action="store_true",
                   help="keep the evaluation namespace (its topics and Redis keys) to read the replays with "
                        "runlog show or audit; by default it is deleted once the report is made")
    p.add_argument("--json", action="store_true", help="print the reports as JSON")
    p.set_defaults(func=_replay)


def _clean(settings: Settings) -> int:
    from runlog.processors.replay import drop_namespace, eval_namespaces

    spaces = eval_namespaces(settings)
    for ns in spaces:
        topics, keys = drop_namespace(settings, ns)
        print(f"deleted {ns}: {len(topics)} topics, {keys} Redis keys")
    print(f"{len(spaces)} evaluation namespaces deleted")
    return EXIT_OK


def parse_set(items: list[str]) -> dict[str, Any]:
    """``["k=v", ...]`` -> ``{k: v}``, ``v`` parsed as JSON when it is JSON, else kept as text.

    Raises:
        ValueError: an item without ``=`` or with an empty name.
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--set wants PARAM=VALUE, got {item!r}")
        try:
            out[key.strip()] = json.loads(raw)
        except ValueError:
            out[key.strip()] = raw
    return out


def parse_since(text: str) -> int:
    """Epoch milliseconds from ``text`` (digits, or an ISO 8601 time with a zone).

    Raises:
        ValueError: neither, or an ISO time without a zone.
    """
    if text.isdigit():
        return int(text)
    at = datetime.fromisoformat(text)
    if at.tzinfo is None:
        raise ValueError(f"--since {text!r} has no time zone (add +00:00)")
    return int(at.timestamp() * 1000)


def _replay(args: argparse.Namespace) -> int:
    from runlog.processors.operate import OperatorRefused
    from runlog.processors.replay import drop_namespace, replay_cohort, replay_run, summary_table
    from runlog.processors.resume import load_app

    if args.run_id == "clean":
        return _clean(Settings.from_env())
    if args.app is None:
        print("runlog replay: --app MODULE:ATTRIBUTE is required (the application registering the run's "
              "workflow version)", file=sys.stderr)
        return EXIT_USAGE
    one_run, cohort = args.run_id is not None, args.workflow is not None
    if one_run == cohort or cohort != (args.since is not None):
        print("runlog replay: give a RUN, or --workflow NAME --since TIME (not both)", file=sys.stderr)
        return EXIT_USAGE
    try:
        params = parse_set(args.set_params)
        since = parse_since(args.since) if args.since is not None else 0
    except ValueError as err:
        print(f"runlog replay: {err}", file=sys.stderr)
        return EXIT_USAGE
    settings = Settings.from_env()
    app = load_app(args.app)
    try:
        if one_run:
            reports = [replay_run(settings, app, args.run_id, model=args.model, set_params=params)]
            namespace = reports[0].namespace
        else:
            namespace, reports = replay_cohort(settings, app, args.workflow, since, model=args.model,
                                               set_params=params, limit=args.limit)
    except OperatorRefused as err:
        print(f"runlog replay: refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    if not args.keep:
        drop_namespace(settings, namespace)
    if args.json:
        print(json.dumps({"namespace": namespace, "kept": args.keep,
                          "replays": [r.to_dict() for r in reports]}, indent=2))
    else:
        for rep in reports if one_run else ():
            print(f"replay of {rep.run_id} ({rep.workflow}) as {rep.replay_run_id} in {rep.namespace}: "
                  f"{rep.status}{' - ' + rep.reason if rep.reason else ''}")
            for stage, how in rep.outputs.items():
                print(f"  output of {stage}: {how}")
            for c in rep.calls:
                print(f"  {c.call_id:<40} {c.how:<9} {c.detail}".rstrip())
        print(summary_table(reports))
        if args.keep:
            print(f"namespace: {namespace} (RUNLOG_TOPIC_PREFIX={settings.topic_prefix}{namespace}. "
                  f"RUNLOG_REDIS_PREFIX={settings.redis_prefix}:{namespace} to read the replays; "
                  "runlog replay clean deletes it)")
        else:
            print(f"namespace: {namespace} (deleted; --keep keeps it to read the replays)")
    return EXIT_OK if all(r.status == "completed" for r in reports) else EXIT_REFUSED
