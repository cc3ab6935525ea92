"""``runlog bench``: Runlog against the raw clients, side by side, on the configured broker and Redis."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
from typing import Any

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK, EXIT_USAGE
from runlog.schemas.settings import Settings

DEFAULT_PLOT = ".runlog/reports/bench.png"


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bench",
        help="benchmark Runlog against raw confluent-kafka, fastavro and redis-py (ratios)",
        description=(
            "Measure appends, confirmed appends, projection, end-to-end lag, resume and rebuild, "
            "and many concurrent runs in one process (AsyncRunner on one loop against the Runner with "
            "a thread per run), each beside its raw-client baseline in the same run, in private topics "
            "and Redis keys that are deleted afterwards. Exit 1 when a target is missed."
        ),
    )
    p.add_argument("--size", choices=["tiny", "quick", "full"], default="quick",
                   help="quick: a minute or two; full: the published figures (much longer)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.add_argument("--plot", default=None, metavar="PATH",
                   help=f"where to write the PNG plot of the resume section ('' for none; default "
                        f"{DEFAULT_PLOT} when matplotlib, the plot extra, is installed)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--only", metavar="SECTION[,SECTION...]", default=None,
                   help="run only these sections (append, intent, scale, projector, lag, resume, "
                        "concurrency, conversation, steps, streams, fleet, encryption); targets are reported "
                        "for them alone")
    p.add_argument("--async-runs", type=int, default=None, metavar="N",
                   help="concurrent runs on the AsyncRunner in the concurrency section (default: the size's)")
    p.add_argument("--threaded-runs", type=int, default=None, metavar="M",
                   help="concurrent runs (a thread each) on the Runner in the concurrency section")
    p.set_defaults(func=_bench)


def _clean(v: Any) -> Any:
    if isinstance(v, float):
        return None if math.isnan(v) or math.isinf(v) else round(v, 4)
    if isinstance(v, dict):
        return {k: _clean(x) for k, x in v.items()}
    if isinstance(v, list | tuple):
        return [_clean(x) for x in v]
    return v


def _plot_path(arg: str | None, sections: list[str]) -> str | None:
    """Where the plot goes: ``--plot`` as given (``''``: none); by default :data:`DEFAULT_PLOT`, or
    none, with one line saying why, when matplotlib is not installed."""
    from runlog.processors.bench.harness import PlotUnavailable, require_plot

    if arg is not None:
        return arg or None
    if "resume" not in sections:
        return None  # only the resume section is plotted
    try:
        require_plot()
    except PlotUnavailable as err:
        print(f"runlog bench: no plot: {err}", file=sys.stderr)
        return None
    return DEFAULT_PLOT


def _bench(args: argparse.Namespace) -> int:
    from runlog.processors.bench import SIZES, PlotUnavailable, run_bench
    from runlog.processors.bench.harness import SECTIONS

    if args.only is not None:
        unknown = [x for x in args.only.split(",") if x.strip() not in SECTIONS]
        if unknown or not args.only.strip():
            print(f"runlog bench: unknown section(s) {unknown}; choose from {', '.join(SECTIONS)}",
                  file=sys.stderr)
            return EXIT_USAGE
    size = SIZES[args.size]
    if args.async_runs is not None or args.threaded_runs is not None:
        if any(n is not None and n < 1 for n in (args.async_runs, args.threaded_runs)):
            print("runlog bench: --async-runs and --threaded-runs must be at least 1", file=sys.stderr)
            return EXIT_USAGE
        size = dataclasses.replace(
            size, async_runs=size.async_runs if args.async_runs is None else args.async_runs,
            threaded_runs=size.threaded_runs if args.threaded_runs is None else args.threaded_runs)
        size = dataclasses.replace(size, name=f"{size.name}, {size.async_runs} async / {size.threaded_runs} "
                                              "threaded runs")
    sections = list(SECTIONS) if args.only is None else [x.strip() for x in args.only.split(",")]
    try:
        out = run_bench(Settings.from_env(), size, progress=None if args.quiet else sys.stderr,
                        plot=_plot_path(args.plot, sections), only=args.only)
    except PlotUnavailable as err:
        print(f"runlog bench: {err}", file=sys.stderr)
        return EXIT_USAGE
    doc = _clean(out)
    if args.json:
        print(json.dumps(doc, sort_keys=False))
    else:
        for name, t in doc["targets"].items():
            flag = "ok  " if t["met"] else "MISS"
            print(f"{flag} {name:<26} {t['value']!s:>10}  target {t['target']}")
        if out.get("plot"):
            print(f"plot: {out['plot']}")
    return EXIT_OK if all(t["met"] for t in doc["targets"].values()) else EXIT_FOUND
