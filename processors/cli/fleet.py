"""``runlog submit`` (a run for the fleet) and ``runlog worker`` (a process of the fleet)."""

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


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "submit", help="submit a run to the fleet's workers (runlog worker) and print its id",
        description="Write a run submission to the submissions topic (durable once this returns) and print "
                    "the run's id; with --wait, wait for its outcome and print it. The same --key with the "
                    "same workflow and params is the same run; with others, a conflict (exit 1).")
    p.add_argument("workflow", help="the workflow's name (registered by the workers' App)")
    p.add_argument("--params", default="{}", metavar="JSON", help="the run's parameters, a JSON object")
    p.add_argument("--key", default=None, help="the run's idempotency key (default: a new one)")
    p.add_argument("--version", default=None, help="the workflow version to start (default: the newest "
                   "the worker that takes it serves)")
    p.add_argument("--queue", default="default", help="the queue the run waits and counts in")
    p.add_argument("--priority", type=int, default=0, help="higher first within the queue")
    p.add_argument("--tenant", default=None, help="whose run (per-tenant limits and fairness)")
    p.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                   help="wait up to SECONDS for the run's outcome and print it as JSON")
    p.set_defaults(func=_submit)

    p = sub.add_parser(
        "worker", help="run a worker: start submitted runs and resume the runs nobody continues",
        description="Join the App's resumer group (resume requests, the sweep of dead runs) and its intake "
                    "(submitted runs, at most --concurrency executing at once). SIGTERM stops taking "
                    "submissions and lets the runs in hand finish (a second SIGTERM abandons them: their "
                    "leases expire and the group resumes them), exit 0.")
    p.add_argument("--app", required=True, help="module:attribute naming a runlog.App")
    p.add_argument("--concurrency", type=int, default=4, help="submitted runs executing at once (default 4)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port (0: a free one; default: none)")
    p.set_defaults(func=_worker)


def _submit(args: argparse.Namespace) -> int:
    from runlog.processors.fleet import Client

    try:
        params = json.loads(args.params)
    except json.JSONDecodeError as err:
        print(f"runlog submit: --params is not JSON: {err}", file=sys.stderr)
        return EXIT_USAGE
    if not isinstance(params, dict):
        print("runlog submit: --params must be a JSON object", file=sys.stderr)
        return EXIT_USAGE
    with Client(Settings.from_env(), name="runlog submit") as client:
        run = client.submit(args.workflow, params, key=args.key, version=args.version, queue=args.queue,
                            priority=args.priority, tenant=args.tenant)
        print(run.run_id, flush=True)
        what = "submitted" if run.created else "the key names an earlier submission of"
        print(f"runlog submit: {what} run {run.run_id}", file=sys.stderr)
        if args.wait is None:
            return EXIT_OK
        try:
            result = run.result(timeout=args.wait)
        except TimeoutError as err:
            print(f"runlog submit: {err}", file=sys.stderr)
            return EXIT_FOUND
        print(json.dumps({"run_id": result.run_id, "completed": result.completed, "waiting": result.waiting,
                          "outputs": result.outputs}), flush=True)
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    from runlog.processors.fleet import Taken, Worker
    from runlog.processors.resume import load_app

    if args.concurrency < 1:
        print(f"runlog worker: --concurrency must be at least 1, not {args.concurrency}", file=sys.stderr)
        return EXIT_USAGE
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s", stream=sys.stderr)
    settings = Settings.from_env()
    app = load_app(args.app)

    def resumed(o: Any) -> None:
        print(json.dumps({"run_id": o.run_id, "result": o.result, "epoch": o.epoch, "detail": o.detail}),
              flush=True)

    def taken(t: Taken) -> None:
        if t.outcome != "not_mine":
            print(json.dumps({"run_id": t.run_id, "submission": t.outcome, "detail": t.detail}), flush=True)

    def finished(run_id: str, r: Any) -> None:
        done = not isinstance(r, BaseException)
        print(json.dumps({"run_id": run_id, "executed": "completed" if done and r.completed else
                          ("waiting" if done and r.waiting else "stopped"),
                          "detail": "" if done else f"{type(r).__name__}: {r}"}), flush=True)

    stopping = threading.Event()
    abandon = threading.Event()

    def on_sigterm(signum: int, frame: object) -> None:
        if stopping.is_set():
            abandon.set()
            raise KeyboardInterrupt
        stopping.set()
        print("worker: SIGTERM, taking nothing new; the runs in hand finish first", file=sys.stderr,
              flush=True)

    previous = signal.signal(signal.SIGTERM, on_sigterm)
    worker = Worker(settings, app, concurrency=args.concurrency, on_outcome=resumed, on_taken=taken,
                    on_result=finished, metrics_port=args.metrics_port)
    started = 0
    try:
        if worker.service.metrics_server is not None:
            print(f"worker: metrics on port {worker.service.metrics_server.port}", file=sys.stderr,
                  flush=True)
        print(f"worker: serving group {worker.service.group} (+ intake), concurrency {args.concurrency}",
              file=sys.stderr, flush=True)
        started = worker.serve(stop=stopping.is_set)
    finally:
        try:
            worker.close(wait=not abandon.is_set())
        finally:
            signal.signal(signal.SIGTERM, previous)
    print(f"worker: started {started} submitted runs" + (", stopped by SIGTERM" if stopping.is_set() else ""),
          file=sys.stderr, flush=True)
    return EXIT_OK
