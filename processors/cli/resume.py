"""``runlog resume`` (request a resume, or print its plan) and ``runlog resumer`` (a member of the App's
resumer group)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Any

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from runlog.schemas import Settings

DEMO_APP = "runlog.processors.demo.pipeline:app"
_DEMO_APP = DEMO_APP


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("resume", help="request a resume (or print its plan with --dry-run)")
    p.add_argument("run_id", help="the run to resume")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resume plan and change nothing: no lease, no event, no effect")
    p.add_argument("--app", default=None, metavar="MODULE:ATTRIBUTE",
                   help="the application (a runlog.App) the plan is made with; required with "
                   f"--dry-run (the demo's is {_DEMO_APP}); modules are found in the current directory")
    p.add_argument("--json", action="store_true", help="with --dry-run: print the plan as one JSON object")
    p.set_defaults(func=_resume)

    p = sub.add_parser(
        "resumer", help="run a resumer: consume resume requests as a group, sweep dead runs",
        description="Join the App's resumer group on the resume topic and sweep for dead runs. SIGTERM "
                    "(or the end of --idle-exit) stops it cleanly: the request in hand is finished and "
                    "committed, the consumer leaves the group, exit 0; a second SIGTERM abandons the "
                    "request in hand uncommitted (the group's next owner of its partition gets it again). "
                    "RUNLOG_GROUP_INSTANCE_ID makes it a static member of the group. A Redis that does "
                    "not answer at start is waited for (RUNLOG_STARTUP_WAIT_MS), then exit 3.")
    p.add_argument("--app", required=True, help="module:attribute naming a runlog.App")
    p.add_argument("--idle-exit", type=float, default=None, metavar="SECONDS",
                   help="stop after this long without a request (default: run forever)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port (0: a free one; default: none)")
    p.set_defaults(func=_resumer)



def _run_known(settings: Settings, run_id: str) -> bool:
    """Whether Redis (projected state or checkpoints) or the events topic knows the run."""
    from runlog.processors.inspect import partitions_of
    from runlog.projections import RedisStore, run_events
    from runlog.schemas import partition_for

    store = RedisStore.from_settings(settings)
    try:
        if store.load_state(run_id) is not None or store.checkpoints(run_id, last=1):
            return True
    finally:
        store.client.close()
    events = run_events(settings, run_id, partition_for(run_id, partitions_of(settings)), 0)
    try:
        return next(events, None) is not None
    finally:
        getattr(events, "close", lambda: None)()  # a generator: closes its consumer


#: a run in one of these states has nothing a resume would do; what to run instead
_FINISHED = {
    "COMPLETED": "it has nothing left to run",
    "CANCELLED": "an operator cancelled it",
    "FAILED": "a stage failed; `runlog retry RUN --app MODULE:APP --by WHO` runs it again",
}


def _unknown(run_id: str, what: str) -> int:
    print(f"runlog resume: no run {run_id!r} in Redis or on the events topic; {what}", file=sys.stderr)
    return EXIT_FOUND


def _resume(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    if not args.dry_run:
        from runlog.processors.operate import load_run
        from runlog.processors.resume import request_resume

        if not _run_known(settings, args.run_id):  # a missing events topic: a configuration error
            return _unknown(args.run_id, "nothing requested")
        state = load_run(settings, args.run_id)  # as of the end of the log: the epoch this request sees
        if state is not None and state.status.value in _FINISHED:
            print(f"runlog resume: run {args.run_id} is {state.status.value}: "
                  f"{_FINISHED[state.status.value]}; nothing requested", file=sys.stderr)
            return EXIT_FOUND
        seen = state.epoch if state is not None else None
        request_resume(settings, args.run_id, "requested by runlog resume", requested_by="cli",
                       seen_epoch=seen)
        print(f"resume of {args.run_id} requested on the resume topic"
              + (f" (run {state.status.value} at epoch {seen})" if state is not None else ""))
        return EXIT_OK
    from runlog.processors.resume import Resumer, UnknownRun, load_app
    from runlog.processors.resume.resumer import NOT_ACTED

    if args.app is None:
        if not _run_known(settings, args.run_id):
            return _unknown(args.run_id, "nothing to plan")
        print("runlog resume: --dry-run plans with the application's workflows and tools: pass "
              f"--app module:attribute (the demo's: --app {_DEMO_APP})", file=sys.stderr)
        return EXIT_USAGE
    with Resumer(settings, load_app(args.app)) as r:
        try:
            outcome = r.resume(args.run_id, dry_run=True)
        except UnknownRun:
            return _unknown(args.run_id, "nothing to plan")
    plan = outcome.plan.to_dict()
    from runlog.processors.operate import writer_lease_ms

    writer = writer_lease_ms(settings, args.run_id) if plan["status"] == "RUNNING" else None
    if args.json:
        print(json.dumps({**plan, "writer_lease_ms": writer}))
        return EXIT_OK
    cp = plan["checkpoint"]
    print(f"run {plan['run_id']} ({plan['status']}): read {plan['events_read']} events of the tail")
    if writer is not None:
        print(f"writer: a live one holds the lease ({writer} ms left): a resume waits for it" if writer > 0
              else "writer: none (its lease is gone): a resume takes the run over")
    print(f"checkpoint: {cp['checkpoint_id'] + ' (' + cp['stage'] + ')' if cp else 'none (start over)'}; "
          f"{plan['artifacts_checked']} artifacts checked")
    for rej in plan["checkpoints_rejected"]:
        print(f"  rejected {rej['checkpoint_id']}: {rej['reason']}")
    print(f"continue from: {plan['from_stage']}")
    print(f"reuse recorded results: {', '.join(plan['reused_calls']) or 'none'}")
    for e in plan["effects"]:
        print(f"effect {e['tool']} {e['call_id']} [{e['policy']}]: {e['action']} - {e['detail']}")
    if plan["blocked_reason"] and outcome.result not in NOT_ACTED:
        print(f"would block: {plan['blocked_reason']}")
    if outcome.result == "nothing_to_do":
        print("nothing to do: the run is complete")
    if outcome.result == "not_mine":
        print(f"not mine: {outcome.detail}; this App's resumers commit its requests without acting")
    if outcome.result == "not_served":
        print(f"not served: {outcome.detail}")
    return EXIT_OK


def _resumer(args: argparse.Namespace) -> int:
    from runlog.processors._startup import Stopped, wait_for_redis
    from runlog.processors.resume import ResumerService, load_app

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    settings = Settings.from_env()

    def report(o: Any) -> None:
        print(json.dumps({"run_id": o.run_id, "result": o.result, "epoch": o.epoch, "detail": o.detail}),
              flush=True)

    stopping = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if stopping.is_set():  # asked twice: abandon the request in hand, uncommitted
            raise KeyboardInterrupt
        stopping.set()  # serve() returns once the request in hand is handled and committed
        print("resumer: SIGTERM, stopping after the request in hand", file=sys.stderr, flush=True)

    app = load_app(args.app)  # a wrong --app is said before any wait for the services
    try:
        wait_for_redis(settings, "resumer")
    except Stopped:  # SIGTERM before it joined anything: nothing to finish
        return EXIT_OK
    previous = signal.signal(signal.SIGTERM, on_sigterm)
    try:
        with ResumerService(settings, app, on_outcome=report,
                            metrics_port=args.metrics_port) as service:
            if service.metrics_server is not None:
                print(f"resumer: metrics on port {service.metrics_server.port}", file=sys.stderr, flush=True)
            print(f"resumer: serving group {service.group}", file=sys.stderr, flush=True)
            handled = service.serve(idle_exit_s=args.idle_exit, stop=stopping.is_set)
        # closing the service closed the consumer: it left the group
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(f"resumer: handled {handled} requests" + (", stopped by SIGTERM" if stopping.is_set() else ""),
          file=sys.stderr, flush=True)
    return EXIT_OK


