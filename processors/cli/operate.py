"""``runlog resolve|cancel|retry``: people act on runs through the log (:mod:`runlog.processors.operate`).

Exit 0 when the action was appended (``retry``: when the run completed), 1 when it was refused
(one line on stderr, nothing appended) or the retried run did not complete.
"""

from __future__ import annotations

import argparse
import json
import sys

from runlog.processors.cli.codes import EXIT_OK, EXIT_REFUSED
from runlog.schemas import Settings

_DEMO_APP = "runlog.processors.demo.pipeline:app"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("resolve", help="decide an in-doubt effect of a blocked run: done (with its id) "
                       "or not done",
                       description="Take the run's lease at a new epoch and append EFFECT_RESOLVED (who, "
                       "why, what was decided); the effect is closed in the run and in the effects ledger. "
                       "The next resume reuses the external id (--done) or runs the tool once (--not-done). "
                       "Refused, with nothing appended, unless the run is BLOCKED and the key (or an "
                       "unambiguous prefix) names one of its open effects.")
    p.add_argument("run_id", help="the blocked (or cancelled) run whose effect is open")
    p.add_argument("--effect", required=True, metavar="DELIVERY_KEY",
                   help="the open effect's delivery key, or a prefix matching exactly one")
    decided = p.add_mutually_exclusive_group(required=True)
    decided.add_argument("--done", action="store_true", help="it happened (give --external-id)")
    decided.add_argument("--not-done", action="store_true", help="it did not happen: the tool runs once")
    p.add_argument("--external-id", default=None, help="the id the external system gave the effect")
    _who_why(p, reason_required=True)
    p.add_argument("--no-resume", action="store_true",
                   help="do not request a resume on the resume topic (the resumers' sweep still finds it)")
    p.set_defaults(func=_resolve)

    p = sub.add_parser("cancel", help="cancel a run: its writer is fenced, nothing resumes it",
                       description="Take the run's lease by force at a new epoch and append RUN_CANCELLED "
                       "(who, why). A live writer's later events are rejected and it starts no further "
                       "tool call; resumers and the sweep skip the run. Effects already done stay recorded. "
                       "Refused for a COMPLETED or already CANCELLED run.")
    p.add_argument("run_id", help="the run to cancel")
    _who_why(p, reason_required=True)
    p.set_defaults(func=_cancel)

    p = sub.add_parser("retry", help="resume a FAILED (or fixed BLOCKED) run from its last checkpoint "
                       "(in this process)",
                       description="The failed stage runs again from its start at a new epoch: recorded "
                       "results of calls before the failure are reused, the failed call is made again. "
                       "A run whose last failure is terminal (not retryable) needs --force. A BLOCKED run "
                       "whose cause was fixed (artifacts restored, its workflow deployed again) is resumed "
                       "the same way (resumers leave a blocked run alone); in-doubt effects are decided "
                       "with runlog resolve instead.")
    p.add_argument("run_id", help="the FAILED (or BLOCKED, its cause fixed) run to retry")
    p.add_argument("--force", action="store_true", help="retry even though the failure was terminal")
    p.add_argument("--app", default=_DEMO_APP, metavar="MODULE:ATTRIBUTE",
                   help="the application (a runlog.App) whose workflow the run is "
                   "(default: %(default)s)")
    _who_why(p, reason_required=False)
    p.set_defaults(func=_retry)


def _who_why(p: argparse.ArgumentParser, *, reason_required: bool) -> None:
    # required options look required: without them argparse answers (usage, exit 2); a blank value
    # is refused by runlog.processors.operate (exit 1)
    p.add_argument("--by", required=True, metavar="WHO", help="who is acting (recorded on the log)")
    p.add_argument("--reason", required=reason_required, default="", metavar="TEXT",
                   help="why (recorded on the log)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _refused(command: str, err: Exception) -> int:
    print(f"runlog {command}: refused: {err}", file=sys.stderr)
    return EXIT_REFUSED


def _resolve(args: argparse.Namespace) -> int:
    from runlog.processors.operate import OperatorRefused, resolve_effect

    settings = Settings.from_env()
    try:
        res = resolve_effect(settings, args.run_id, args.effect, done=bool(args.done),
                             external_id=args.external_id, by=args.by, reason=args.reason)
    except OperatorRefused as err:
        return _refused("resolve", err)
    requested = False
    if not args.no_resume and res.status == "RUNNING":
        from runlog.processors.resume import request_resume

        request_resume(settings, res.run_id, f"effect resolved by {args.by.strip()}", requested_by="operator")
        requested = True
    if args.json:
        print(json.dumps({**res.to_dict(), "resume_requested": requested}))
    else:
        print(res.detail + ("; resume requested" if requested else ""))
    return EXIT_OK


def _cancel(args: argparse.Namespace) -> int:
    from runlog.processors.operate import OperatorRefused, cancel_run

    try:
        res = cancel_run(Settings.from_env(), args.run_id, by=args.by, reason=args.reason)
    except OperatorRefused as err:
        return _refused("cancel", err)
    print(json.dumps(res.to_dict()) if args.json else res.detail)
    return EXIT_OK


def _retry(args: argparse.Namespace) -> int:
    from runlog.processors.operate import OperatorRefused, retry_run
    from runlog.processors.resume import describe, load_app

    try:
        outcome = retry_run(Settings.from_env(), load_app(args.app), args.run_id, by=args.by,
                            force=args.force, reason=args.reason)
    except OperatorRefused as err:
        return _refused("retry", err)
    if args.json:
        doc = describe(outcome)
        doc.pop("plan", None)
        print(json.dumps(doc))
    else:
        print(f"retry of {outcome.run_id} at epoch {outcome.epoch}: {outcome.result}"
              + (f" - {outcome.detail}" if outcome.detail else ""))
    return EXIT_OK if outcome.result == "completed" else EXIT_REFUSED
