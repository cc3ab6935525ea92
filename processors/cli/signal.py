"""``runlog signal`` / ``approve`` / ``reject``: deliver a signal to a run waiting in ``ctx.wait_for``."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from runlog.processors.cli.codes import EXIT_OK, EXIT_REFUSED
from runlog.schemas import Settings

if TYPE_CHECKING:
    from runlog.processors.operate import OperatorResult


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    s = sub.add_parser("signal", help="deliver a signal (JSON data) to a run waiting for it",
                       description="Append SIGNAL_RECEIVED to a WAITING run under a new lease epoch and "
                                   "request its resume; refused (exit 1, nothing appended) when the run "
                                   "does not wait for that signal.")
    s.add_argument("run_id", help="the waiting run")
    s.add_argument("name", help="the signal the run waits for (ctx.wait_for(name))")
    s.add_argument("--data", default="null", help="the signal's data, JSON (default: null)")
    _common(s)
    s.set_defaults(func=_signal)
    for verb, approved in (("approve", True), ("reject", False)):
        p = sub.add_parser(verb, help=f"signal 'approval' with {{\"approved\": {str(approved).lower()}}}")
        p.add_argument("run_id", help="the run waiting for the approval")
        p.add_argument("--signal", default="approval", help="the signal name (default: %(default)s)")
        _common(p)
        p.set_defaults(func=_approve if approved else _reject)


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--by", required=True, help="who is acting (recorded on the log)")
    p.add_argument("--reason", default="", help="why (recorded on the log)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")


def _run(args: argparse.Namespace, name: str, data: Any) -> int:
    from runlog.processors.operate import OperatorRefused
    from runlog.processors.signal import signal_run

    try:
        res = signal_run(Settings.from_env(), args.run_id, name, data, by=args.by, reason=args.reason)
    except OperatorRefused as err:
        print(f"runlog {args.command}: refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    return print_result(res, as_json=args.json)


def print_result(res: OperatorResult, *, as_json: bool) -> int:
    """Print what an operator event appended (one JSON object, or one line); exit 0."""
    if as_json:
        print(json.dumps({"run_id": res.run_id, "action": res.action, "epoch": res.epoch, "seq": res.seq,
                          "detail": res.detail}))
    else:
        print(f"{res.run_id}: {res.detail} (seq {res.seq}, epoch {res.epoch})")
    return EXIT_OK


def _signal(args: argparse.Namespace) -> int:
    from runlog.processors.operate import OperatorRefused
    from runlog.processors.signal import parse_data

    try:
        data = parse_data(args.data)
    except OperatorRefused as err:
        print(f"runlog signal: refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    return _run(args, args.name, data)


def _approve(args: argparse.Namespace) -> int:
    return _run(args, args.signal, {"approved": True})


def _reject(args: argparse.Namespace) -> int:
    return _run(args, args.signal, {"approved": False})
