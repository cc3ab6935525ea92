"""``runlog budget``: set a run's budget caps (:mod:`runlog.processors.budget`)."""

from __future__ import annotations

import argparse
import sys

from runlog.processors.cli.codes import EXIT_REFUSED
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "budget", help="raise (or set) a run's budget; a run waiting at its cap (or failed on it) goes on",
        description="Append SIGNAL_RECEIVED (signal runlog.budget) with the new caps, who and why under a "
        "new lease epoch; a cap not given is kept. A run waiting at a hard cap is resumed and checks its "
        "next model call against the new caps. Refused (exit 1, nothing appended) for a completed or "
        "cancelled run, a blank --by or --reason, or without a cap; without --by or --reason: exit 2.")
    p.add_argument("run_id", help="the run")
    p.add_argument("--tokens", type=int, default=None, metavar="N", help="hard cap: input plus output tokens")
    p.add_argument("--cost-usd", type=float, default=None, metavar="USD",
                   help="hard cap: US dollars (priced by the App's prices)")
    p.add_argument("--soft-tokens", type=int, default=None, metavar="N", help="soft cap (a warning): tokens")
    p.add_argument("--soft-cost-usd", type=float, default=None, metavar="USD",
                   help="soft cap (a warning): US dollars")
    p.add_argument("--by", required=True, help="who is acting (recorded on the log)")
    p.add_argument("--reason", required=True, help="why (recorded on the log)")
    p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    p.set_defaults(func=_budget)


def _budget(args: argparse.Namespace) -> int:
    from runlog.processors.budget import raise_budget
    from runlog.processors.cli.signal import print_result
    from runlog.processors.operate import OperatorRefused

    try:
        res = raise_budget(Settings.from_env(), args.run_id, tokens=args.tokens, cost_usd=args.cost_usd,
                           soft_tokens=args.soft_tokens, soft_cost_usd=args.soft_cost_usd, by=args.by,
                           reason=args.reason)
    except OperatorRefused as err:
        print(f"runlog budget: refused: {err}", file=sys.stderr)
        return EXIT_REFUSED
    return print_result(res, as_json=args.json)
