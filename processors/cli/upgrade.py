"""``runlog upgrade``: move runs in flight to another version of their workflow
(:mod:`runlog.processors.upgrade`).

Exit 0 when the upgrade was appended and the run completed or waits (``--dry-run``: when it would be
allowed), 1 when it was refused (one line on stderr, nothing appended) or the run did not complete.
"""

from __future__ import annotations

import argparse
import json
import sys

from runlog.processors.cli.codes import EXIT_OK, EXIT_REFUSED, EXIT_USAGE
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "upgrade", help="continue runs in flight on another version of their workflow (or a fixed "
        "definition of the same version)",
        description="Take the run's lease at a new epoch, append RUN_UPGRADED (from, to, the checkpoint "
        "kept, who, why) and continue the run in this process on the new code: from its latest "
        "checkpoint whose completed stages are unchanged in the new version (stage fingerprints), "
        "re-running the rest. Effects go through the effects ledger: one done under the old version "
        "is not executed again. Refused, with nothing appended, for a settled run, a run a live writer "
        "holds, a version the App does not register, or effects in doubt (runlog resolve them first). "
        "--dry-run prints what the upgrade would do.")
    p.add_argument("run_id", nargs="?", default=None,
                   help="the run to upgrade (or --workflow with --from for every open run of a version)")
    p.add_argument("--to", required=True, metavar="VERSION",
                   help="the version to continue on (the run's own version: its fixed definition)")
    p.add_argument("--app", required=True, metavar="MODULE:ATTRIBUTE",
                   help="the application (a runlog.App) registering the new version")
    p.add_argument("--workflow", default=None, metavar="NAME",
                   help="with --from and no RUN: upgrade every open run of NAME@FROM")
    p.add_argument("--from", dest="from_version", default=None, metavar="VERSION",
                   help="with --workflow: the version whose open runs are upgraded")
    p.add_argument("--dry-run", action="store_true", help="print what the upgrade would do; append nothing")
    p.add_argument("--by", required=True, metavar="WHO", help="who is acting (recorded on the log)")
    p.add_argument("--reason", required=True, metavar="TEXT", help="why (recorded on the log)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=_upgrade)


def _upgrade(args: argparse.Namespace) -> int:
    from runlog.processors.operate import OperatorRefused
    from runlog.processors.resume import load_app
    from runlog.processors.upgrade import UpgradeResult, upgrade_run, upgrade_runs

    settings = Settings.from_env()
    app = load_app(args.app)
    one_run, bulk = args.run_id is not None, args.workflow is not None
    if one_run == bulk or bulk != (args.from_version is not None):
        print("runlog upgrade: give a RUN, or --workflow NAME --from VERSION (not both)", file=sys.stderr)
        return EXIT_USAGE
    if args.run_id is not None:
        try:
            results: list[tuple[str, UpgradeResult | str]] = [(args.run_id, upgrade_run(
                settings, app, args.run_id, args.to, by=args.by, reason=args.reason, dry_run=args.dry_run))]
        except OperatorRefused as err:
            print(f"runlog upgrade: refused: {err}", file=sys.stderr)
            return EXIT_REFUSED
    else:
        results = upgrade_runs(settings, app, args.workflow, args.from_version, args.to, by=args.by,
                               reason=args.reason, dry_run=args.dry_run)
    ok = True
    docs = []
    for run_id, res in results:
        if isinstance(res, str):
            ok = False
            docs.append({"run_id": run_id, "refused": res})
            if not args.json:
                print(f"{run_id}: refused: {res}")
            continue
        good = args.dry_run or (res.outcome is not None and res.outcome.result in ("completed", "waiting"))
        ok = ok and good
        docs.append({"run_id": run_id, **res.to_dict()})
        if args.json:
            continue
        print("\n".join(res.plan.describe()))
        if res.outcome is not None:
            print(f"ran: {', '.join(res.executed_stages) or 'no stage'}; {res.outcome.result}"
                  + (f" - {res.outcome.detail}" if res.outcome.detail else ""))
    if args.json:
        print(json.dumps(docs if args.run_id is None else docs[0]))
    elif args.run_id is None:
        print(f"{len(results)} open run(s) of {args.workflow}@{args.from_version}")
    return EXIT_OK if ok else EXIT_REFUSED
