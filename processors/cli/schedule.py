"""``runlog schedule add|list|pause|resume|remove``: schedules that start one run per tick."""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from runlog.processors.cli._args import json_object
from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK
from runlog.schemas import Settings

if TYPE_CHECKING:
    from runlog.producers import Schedule


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("schedule", help="schedules: start one run of a workflow per tick (cron or period)",
                       description="Schedules are records on the compacted topic runlog.schedules (Redis "
                                   "holds a projection rebuilt from it). The resumer members "
                                   "(runlog resumer) of an App registering the workflow tick them: each "
                                   "tick starts exactly one run, idempotency key schedule:NAME:TICK_MS.")
    verbs = s.add_subparsers(dest="verb", metavar="VERB", required=True)
    a = verbs.add_parser("add", help="add (or replace) a schedule")
    a.add_argument("name", help="the schedule's name (letters, digits, '.', '_', '-')")
    clock = a.add_mutually_exclusive_group(required=True)
    clock.add_argument("--cron", help="5 fields, UTC: minute hour day-of-month month day-of-week, "
                                      "e.g. '0 2 * * *'")
    clock.add_argument("--every", help="a fixed period: 2s, 5m, 1h, 1d (ticks at whole multiples of it)")
    a.add_argument("--workflow", required=True, help="the workflow each tick starts a run of")
    a.add_argument("--params", default="{}", metavar="JSON",
                   help="the runs' parameters, a JSON object (default: {})")
    a.add_argument("--catch-up", choices=["one", "all", "none"], default="one",
                   help="ticks missed while no member ran: start the latest (one), each (all) or none "
                        "(default: %(default)s)")
    a.add_argument("--json", action="store_true", help="print the schedule as one JSON object")
    a.set_defaults(func=_add)
    ls = verbs.add_parser("list", help="list the schedules, their clock, state and next tick")
    ls.add_argument("--json", action="store_true", help="print one JSON array")
    ls.set_defaults(func=_list)
    for verb, helptext in (("pause", "stop ticking a schedule (its ticks meanwhile are skipped)"),
                           ("resume", "tick a paused schedule again, from now"),
                           ("remove", "remove a schedule (a tombstone on the log)")):
        p = verbs.add_parser(verb, help=helptext)
        p.add_argument("name", help="the schedule")
        p.set_defaults(func=_change)


def _iso(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="seconds")


def _doc(s: Schedule, next_ms: int | None, last_ms: int | None) -> dict[str, object]:
    d: dict[str, object] = json.loads(s.to_json())
    d["next_tick_ms"], d["last_tick_ms"] = next_ms, last_ms
    return d


def _add(args: argparse.Namespace) -> int:
    from runlog.processors.schedule import ScheduleBook
    from runlog.producers import Schedule
    from runlog.producers.internal import parse_every

    params = json_object(args.params)
    every = None if args.every is None else parse_every(args.every)  # ConfigError: exit 2
    sched = Schedule(args.name, args.workflow, params, cron=args.cron, every=every, catch_up=args.catch_up)
    with ScheduleBook(Settings.from_env()) as book:
        sched = book.put(sched)
    if args.json:
        print(json.dumps(_doc(sched, sched.next_after(sched.created_at_ms), None)))
    else:
        print(f"schedule {sched.name}: {sched.clock} -> {sched.workflow}, catch-up {sched.catch_up}; "
              f"next tick {_iso(sched.next_after(sched.created_at_ms))}")
    return EXIT_OK


def _list(args: argparse.Namespace) -> int:
    import time

    from runlog.processors.schedule import ScheduleBook

    now = int(time.time() * 1000)
    with ScheduleBook(Settings.from_env()) as book:
        rows = [(s, book.last_handled(s.name)) for s in book.list()]
    if args.json:
        print(json.dumps([_doc(s, None if s.paused else s.next_after(now), last) for s, last in rows]))
        return EXIT_OK
    if not rows:
        print("no schedules")
    for s, last in rows:
        state = "paused" if s.paused else f"next {_iso(s.next_after(now))}"
        print(f"{s.name:<20} {s.clock:<22} {s.workflow:<16} catch-up {s.catch_up:<4} {state}"
              f"  last {_iso(last) if last else '-'}  params {json.dumps(dict(s.params), sort_keys=True)}")
    return EXIT_OK


def _change(args: argparse.Namespace) -> int:
    from runlog.processors.schedule import ScheduleBook, ScheduleNotFound

    try:
        with ScheduleBook(Settings.from_env()) as book:
            if args.verb == "remove":
                book.remove(args.name)
                print(f"schedule {args.name}: removed")
            else:
                s = book.set_paused(args.name, args.verb == "pause")
                print(f"schedule {s.name}: {'paused' if s.paused else 'ticking'}")
    except ScheduleNotFound as err:
        print(f"runlog schedule {args.verb}: {err}", file=sys.stderr)
        return EXIT_FOUND
    return EXIT_OK
