"""``runlog chaos``: a mixed workload on private services under random faults, then the count."""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK, EXIT_USAGE


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from runlog.processors.chaos.faults import KINDS

    p = sub.add_parser(
        "chaos",
        help="run a mixed workload under random faults of every kind, then count duplicates, losses, "
             "differences",
        description=(
            "Start a private broker, Redis and Toxiproxy on free ports in 21000-21999 (never the configured "
            "services), resumer and projector members, and workers keeping a few runs in flight (the demo's "
            "content and checkout workflows and a ledger workflow with a tool of every replay policy and a "
            "wait for a signal, sync and async SDK). For --duration a scheduler injects random faults: "
            "SIGKILL and SIGSTOP of workers, resumers and projectors, broker and Redis restarts, members "
            "joining and leaving, network latency, resets and partitions. Then the faults stop, the runs in "
            "flight end, and it prints runs by status (with the reason of each not completed), effects and "
            "duplicate effects (the demo world's storage), lost events (acknowledged appends missing from "
            "the log), projection differences (a rebuild against the live projection) and dead letters. "
            "Exit 1 when any duplicate, loss, difference or dead letter is found. Needs java with the "
            "Kafka jars, redis-server and toxiproxy-server under RUNLOG_LOCAL_DIR (deploy/local/up and "
            "deploy/local/toxiproxy build)."),
    )
    p.add_argument("--duration", type=float, default=600.0, metavar="SECONDS",
                   help="seconds of faults and new runs (default 600)")
    p.add_argument("--workdir", type=Path, default=None, metavar="DIR",
                   help="where the services, logs and the demo world live (default: a new dir under /tmp)")
    p.add_argument("--seed", type=int, default=None, help="the random seed (default: a random one, printed)")
    p.add_argument("--in-flight", type=int, default=3, metavar="N",
                   help="worker processes at once (default 3)")
    p.add_argument("--gap", default="15,45", metavar="MIN,MAX",
                   help="seconds between two faults, drawn uniformly (default 15,45)")
    p.add_argument("--settle", type=float, default=300.0, metavar="SECONDS",
                   help="at most this long for the runs in flight to end after the faults (default 300)")
    p.add_argument("--kinds", default=",".join(KINDS), metavar="KIND[,KIND...]",
                   help=f"the fault kinds to inject (default all: {', '.join(KINDS)})")
    p.add_argument("--json", type=Path, default=None, metavar="PATH", help="also write the figures as JSON")
    p.set_defaults(func=_chaos, private_services=True)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _chaos(args: argparse.Namespace) -> int:
    from runlog.processors.chaos import KINDS, ChaosOptions, as_json, render, run_chaos, verdict

    try:
        lo, hi = (float(x) for x in str(args.gap).split(","))
    except ValueError:
        print(f"runlog chaos: --gap takes MIN,MAX seconds, not {args.gap!r}", file=sys.stderr)
        return EXIT_USAGE
    kinds = tuple(k.strip() for k in str(args.kinds).split(",") if k.strip())
    unknown = sorted(set(kinds) - set(KINDS))
    if unknown or not kinds or lo <= 0 or hi < lo or args.duration <= 0 or args.in_flight < 1:
        print("runlog chaos: " + (f"unknown fault kinds {', '.join(unknown)} (known: {', '.join(KINDS)})"
                                  if unknown or not kinds else
                                  "--duration, --in-flight and --gap must be positive (MIN <= MAX)"),
              file=sys.stderr)
        return EXIT_USAGE
    workdir = args.workdir or Path(f"/tmp/runlog-chaos-{time.strftime('%Y%m%dT%H%M%S')}")
    opts = ChaosOptions(duration=args.duration, workdir=workdir, seed=args.seed, in_flight=args.in_flight,
                        gap=(lo, hi), settle=args.settle, kinds=kinds)
    # SIGTERM (a supervisor, a timeout) unwinds like Ctrl-C: the private broker, Redis, Toxiproxy and
    # the members this run started are stopped on the way out instead of being left running
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        result = run_chaos(opts, lambda line: print(line, flush=True))
    finally:
        signal.signal(signal.SIGTERM, previous)
    print(render(result), flush=True)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(as_json(result))
    return EXIT_FOUND if verdict(result) else EXIT_OK
