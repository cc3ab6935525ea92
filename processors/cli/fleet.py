"""``runlog submit`` (a run for the fleet), ``runlog worker`` (a process of the fleet) and ``runlog
queues`` (what waits where, and rebuilding the queues from the log)."""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
import threading
from typing import Any

from runlog.processors.cli._args import json_object
from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from runlog.schemas import Settings


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "submit", help="submit a run to the fleet's workers (runlog worker) and print its id",
        description="Write a run submission to the submissions topic (durable once this returns) and print "
                    "the run's id; with --wait, wait for its outcome and print it. The same --key with the "
                    "same workflow and params is the same run; with others, a conflict (exit 1).")
    p.add_argument("workflow", help="the workflow's name (registered by the workers' App)")
    p.add_argument("--params", default="{}", metavar="JSON",
                   help="the run's parameters, a JSON object")
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
                    "leases expire and the group resumes them), exit 0. A Redis that does not answer at "
                    "start is waited for (RUNLOG_STARTUP_WAIT_MS), then exit 3.")
    p.add_argument("--app", required=True, help="module:attribute naming a runlog.App")
    p.add_argument("--concurrency", type=int, default=4, help="submitted runs executing at once (default 4)")
    p.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve Prometheus metrics on this port (0: a free one; default: none)")
    p.set_defaults(func=_worker)

    p = sub.add_parser(
        "queues", help="show the fleet's queues (pending and running per tenant, limits, shares) or "
                       "rebuild them from the log",
        description="show (default): every queue in Redis under the prefix: its App's group, the fleet-wide "
                    "and per-tenant concurrency, and per tenant the runs pending and running, the starts "
                    "so far, its weight and its share of the starts. rebuild --app M:A: queue again every "
                    "submission of the App's workflows on the submissions topic whose run is not on the "
                    "events topic (after Redis lost the queues; a worker does it by itself when it finds "
                    "its queues' keys missing). Queuing is idempotent and a run starts once (its key).")
    p.add_argument("action", nargs="?", choices=["show", "rebuild"], default="show",
                   help="show (default) or rebuild")
    p.add_argument("--app", default=None, help="module:attribute naming the runlog.App (rebuild)")
    p.add_argument("--json", action="store_true", help="print JSON (show: an array, an object per queue)")
    p.set_defaults(func=_queues)


def _submit(args: argparse.Namespace) -> int:
    from runlog.processors.fleet import Client

    params = json_object(args.params)
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


def _queues(args: argparse.Namespace) -> int:
    from runlog.processors.fleet._queues import all_queues
    from runlog.schemas.internal import redis_client

    settings = Settings.from_env()
    if args.action == "rebuild":
        return _rebuild(args, settings)
    client = redis_client(settings)
    try:
        found = all_queues(client, settings.redis_prefix)
    finally:
        client.close()
    if args.json:
        print(json.dumps([q.to_dict() for q in found]))
        return EXIT_OK
    if not found:
        print(f"runlog queues: no queue in Redis under prefix {settings.redis_prefix!r} (a worker declares "
              "its App's queues when it starts)", file=sys.stderr)
        return EXIT_OK
    for q in found:
        d = q.to_dict()
        print(f"queue {d['queue']}  group {d['group']}  concurrency {d['concurrency'] or '-'}  per tenant "
              f"{d['per_tenant'] or '-'}  pending {d['pending']}  running {d['running']}")
        if d["tenants"]:
            print(f"  {'tenant':<20} {'pending':>8} {'running':>8} {'starts':>8} {'weight':>7} {'share':>7}")
        for t in d["tenants"]:
            print(f"  {t['tenant']:<20} {t['pending']:>8} {t['running']:>8} {t['starts']:>8} "
                  f"{t['weight']:>7g} {t['share']:>7.1%}")
    return EXIT_OK


def _rebuild(args: argparse.Namespace, settings: Settings) -> int:
    from runlog.processors.fleet._queues import RedisQueues
    from runlog.processors.fleet._rebuild import rebuild_queues
    from runlog.processors.resume import group_id, load_app
    from runlog.schemas.internal import redis_client

    if args.app is None:
        print("runlog queues rebuild: --app module:attribute is required (whose queues)", file=sys.stderr)
        return EXIT_USAGE
    app = load_app(args.app)
    client = redis_client(settings)
    try:
        queues = RedisQueues(client, settings.redis_prefix, group_id(settings, app))
        report = rebuild_queues(settings, app, queues)
    finally:
        client.close()
    doc = {"submissions": report.submissions, "started": report.started, "queued": report.queued,
           "already": report.already}
    if args.json:
        print(json.dumps(doc))
    else:
        print(f"runlog queues rebuild: {report.submissions} submissions of the App's workflows on the log, "
              f"{report.started} of them started; queued again: "
              + (", ".join(f"{q} {n}" for q, n in sorted(report.queued.items())) or "none")
              + f"; {report.already} waiting or started already")
    return EXIT_OK


def _worker(args: argparse.Namespace) -> int:
    from runlog.processors._startup import Stopped, wait_for_redis
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

    try:
        wait_for_redis(settings, "worker")
    except Stopped:  # SIGTERM before it joined anything: nothing to finish
        return EXIT_OK
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
