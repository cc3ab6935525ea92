"""``runlog bench``: every benchmark with its raw-client baseline, in one run, on the same services.

Each phase works in its own namespace (``bench-<tag>-<phase>`` topics and Redis
keys), deleted at the end whatever happens. Ratios are medians of rounds: the
machine is shared and absolute figures drift, ratios hold better.
"""

from __future__ import annotations

import contextlib
import importlib.util
import math
import os
import platform
import sys
import time
from collections.abc import Callable, Collection
from pathlib import Path
from typing import Any, TextIO

from runlog.processors.bench._concurrency import bench_async_runs, bench_threaded_runs
from runlog.processors.bench._conversation import bench_conversation
from runlog.processors.bench._conversation import unavailable as conversation_unavailable
from runlog.processors.bench._encryption import bench_encryption
from runlog.processors.bench._env import BenchEnv, kafka_replication, replication_mismatch
from runlog.processors.bench._events import ratio
from runlog.processors.bench._fleet import bench_fleet, bench_limiter
from runlog.processors.bench._openloop import SHARES, bench_open_loop
from runlog.processors.bench._read import (
    bench_lag,
    bench_projector,
    bench_rebuild,
    measure_capacity,
    run_group,
)
from runlog.processors.bench._replays import bench_replays
from runlog.processors.bench._resume import bench_resume, bench_resumer_group
from runlog.processors.bench._sizes import SIZES, BenchSize
from runlog.processors.bench._speed import speed_index
from runlog.processors.bench._steps import bench_steps
from runlog.processors.bench._streams import bench_streams
from runlog.processors.bench._write import bench_append, bench_intent, bench_writer_scale
from runlog.processors.projector import ProjectorOptions
from runlog.schemas.errors import ConfigError
from runlog.schemas.settings import Settings

__all__ = ["SECTIONS", "TARGETS", "PlotUnavailable", "Progress", "machine", "plot_result", "require_plot",
           "run_bench", "steps_of", "targets_met"]

TARGETS: dict[str, tuple[str, float]] = {
    "append_ratio": (">=", 0.8),
    "intent_latency_ratio": ("<=", 1.2),
    "projector_ratio": (">=", 0.8),
    "lag_p99_ms": ("<=", 50.0),
    "lag_high_p99_ms": ("<=", 100.0),
    "lag_low_p50_ms": ("<=", 10.0),
    "lag_low_p99_ms": ("<=", 30.0),
    "lag_half_p99_ms": ("<=", 50.0),
    "resume_tail_ratio": ("<=", 1.5),
    "rebuild_ratio": (">=", 0.8),
    "async_memory_per_run_kb": ("<=", 32.0),
    "intent_over_raw_ms": ("<=", 1.0),
    "concurrent_runs_completed": (">=", 1.0),
    "conversation_kb_per_call": ("<=", 24.0),
    "conversation_mb_200": ("<=", 5.0),
    "conversation_growth_ratio": ("<=", 1.1),
    "steps_ratio": (">=", 0.7),
    "steps_calls_per_s": (">=", 2000.0),
    "steps_open_p99_over_idle_at_70_ms": ("<=", 10.0),
    "stream_p99_ms": ("<=", 50.0),
    "encryption_append_ratio": (">=", 0.85),
    "encryption_steps_ratio": (">=", 0.85),
}

SECTIONS: dict[str, tuple[str, ...]] = {
    "append": ("append_ratio",),
    "intent": ("intent_latency_ratio",),
    "scale": (),
    "projector": ("projector_ratio", "rebuild_ratio"),
    "lag": ("lag_p99_ms", "lag_high_p99_ms", "lag_low_p50_ms", "lag_low_p99_ms", "lag_half_p99_ms"),
    "resume": ("resume_tail_ratio",),
    "concurrency": ("async_memory_per_run_kb", "intent_over_raw_ms", "concurrent_runs_completed"),
    "conversation": ("conversation_kb_per_call", "conversation_mb_200", "conversation_growth_ratio"),
    "steps": ("steps_ratio", "steps_calls_per_s", "steps_open_p99_over_idle_at_70_ms"),
    "streams": ("stream_p99_ms",),
    "fleet": (),
    "encryption": ("encryption_append_ratio", "encryption_steps_ratio"),
}
"""What ``runlog bench --only`` can pick, with the targets each one reports. ``projector`` includes
rebuild and the projector group (they read its projected topic); ``concurrency`` is many concurrent
runs in one process, the AsyncRunner's one loop against the Runner's thread per run; ``conversation``
is what a long agent conversation costs to record (log plus artifact bytes per model call; it needs
the ``pydantic-ai`` extra, and is left out of a run of every section without it); ``steps`` is
orchestration throughput, durable calls per second of runs whose tools return at once, against the
raw clients doing the I/O those calls need; ``streams`` is streamed model output, token produced to
a subscriber per run; ``lag`` is broker ack to visible in Redis at fixed offered rates and at 20%
(``lag_low_*``) and 50% (``lag_half_*``) of the projector's measured capacity (its events/s draining
a backlog: the projector section's figure, or measured by the lag section when that did not run);
``encryption`` is append throughput and durable calls per second with payload encryption on against
off (at most 15% cost); ``fleet`` is submitted runs from a client's submit to their ``RUN_STARTED``
on a worker at a steady offered rate, and a model call's rate-limit round trip against a raw Redis
one (figures, no target)."""


def targets_met(figures: dict[str, float], names: tuple[str, ...] | None = None) -> dict[str, dict[str, Any]]:
    """Each target (of ``names``, default all) with its figure, whether it is met, and by how much it
    is missed (as a factor)."""
    out: dict[str, dict[str, Any]] = {}
    for name, (op, want) in TARGETS.items():
        if names is not None and name not in names:
            continue
        v = figures.get(name, math.nan)
        met = (v >= want) if op == ">=" else (v <= want)
        miss = math.nan if math.isnan(v) or met else (want / v if op == ">=" else v / want)
        out[name] = {"value": v, "target": f"{op} {want:g}", "met": bool(met), "missed_by_factor": miss}
    return out


def steps_of(size: BenchSize, sections: tuple[str, ...] = tuple(SECTIONS)) -> int:
    """How many progress ticks a run of this size makes."""
    per = {"append": 2 * size.rounds, "intent": size.rounds, "scale": 1,
           "projector": 4 * size.projector_rounds + 3 + size.rounds + 4 + max(len(size.group_sizes) - 1, 0),
           "lag": 4 + (0 if "projector" in sections else 2),
           "resume": len(size.resume_lengths) + 2, "concurrency": 8, "conversation": 3,
           "steps": 3 * len(size.steps_runs) + 2 + len(SHARES), "streams": 2, "fleet": 4,
           "encryption": 2 * (size.encryption_append_rounds + size.encryption_rounds)
           + (2 if size.encryption_append_rounds > 1 else 0)}
    return sum(per[s] for s in sections) + 1


class Progress:
    """A one-line progress bar (tqdm) on a text stream (stderr), or nothing when ``out`` is None."""

    def __init__(self, total: int, out: TextIO | None) -> None:
        self.total, self.out, self.done = max(total, 1), out, 0
        self.started = time.monotonic()
        self._bar: Any = None
        if out is not None:
            from tqdm import tqdm  # type: ignore[import-untyped]

            self._bar = tqdm(desc="bench", total=self.total, unit=" steps", file=out, dynamic_ncols=True)

    def __call__(self, what: str) -> None:
        self.done += 1
        if self._bar is not None:
            self._bar.set_postfix_str(what[:40], refresh=False)
            self._bar.update(1 if self.done <= self.total else 0)

    def finish(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def machine() -> dict[str, Any]:
    cpu = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = -1
    with contextlib.suppress(OSError, ValueError, IndexError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // 1024
    return {"cpus": os.cpu_count(), "cpu": cpu, "memory_mib": mem, "python": platform.python_version(),
            "platform": platform.platform(), "load_avg_at_start": list(os.getloadavg())}


class PlotUnavailable(ConfigError):
    """``--plot`` asked for, but matplotlib (the ``plot`` extra) is not installed."""


PLOT_HINT = "the plot needs matplotlib: pip install 'runlog[plot]' (or --plot '' for none)"


def require_plot() -> None:
    """Raise :class:`PlotUnavailable` unless matplotlib is installed (looked up, not imported: the import
    takes a second of CPU, before the bench has asked the broker anything).

    Raises:
        PlotUnavailable: matplotlib is not installed.
    """
    if importlib.util.find_spec("matplotlib") is None:
        raise PlotUnavailable(PLOT_HINT)


def plot_result(result: dict[str, Any], path: str) -> str:
    """Draw the resume section's points (rebuild throughput, resume plan and resume time against the
    run length) into a PNG at ``path`` with matplotlib's Agg renderer; returns ``path``.

    Raises:
        PlotUnavailable: matplotlib is not installed.
    """
    require_plot()
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.ticker import FuncFormatter

    pts = sorted(result["resume"]["points"], key=lambda p: p["events"])
    xs = [max(p["events"], 1) for p in pts]
    fig = Figure(figsize=(11, 4.2), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    left, right = fig.subplots(1, 2)
    left.plot(xs, [p["rebuild_events_per_s"] for p in pts], "o-", color="tab:blue",
              label="rebuild of a one-run topic")
    left.set_title("Rebuild throughput against run length")
    left.set_ylabel("events/s")
    right.plot(xs, [p["plan_ms"] for p in pts], "o-", color="tab:blue", label="resume plan")
    right.plot(xs, [p["resume_ms"] for p in pts], "s-", color="tab:red", label="full resume")
    right.set_title("Resume time against run length")
    right.set_ylabel("time (ms)")
    thousands = FuncFormatter(lambda v, _pos: f"{v:,.0f}")
    for ax in (left, right):
        ax.set_xscale("log")
        ax.set_xlabel("run length (events, log scale)")
        ax.set_ylim(bottom=0)
        ax.yaxis.set_major_formatter(thousands)
        ax.grid(True, which="major", alpha=0.3)
        ax.legend(loc="best")
    m = result.get("machine", {})
    fig.suptitle(f"runlog bench --size {result.get('size', '?')}: {m.get('cpus', '?')} CPUs, "
                 f"Python {m.get('python', '?')}", fontsize=10)
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, format="png")
    return path


def _sections(only: str | Collection[str] | None) -> tuple[str, ...]:
    if only is None:
        return tuple(SECTIONS)
    names = [x.strip() for x in only.split(",")] if isinstance(only, str) else list(only)
    unknown = [x for x in names if x not in SECTIONS]
    if unknown or not names:
        raise ValueError(f"unknown bench section(s) {unknown or names}; choose from {', '.join(SECTIONS)}")
    return tuple(x for x in SECTIONS if x in names)


def _figures(result: dict[str, Any]) -> dict[str, float]:
    """The targeted figures of the sections that ran."""
    f: dict[str, float] = {}
    if "append" in result:
        f["append_ratio"] = result["append"]["append_ratio"]
    if "intent_latency" in result:
        f["intent_latency_ratio"] = result["intent_latency"]["intent_latency_ratio"]
    if "projector" in result:
        f["projector_ratio"] = result["projector"]["projector_ratio"]
        f["rebuild_ratio"] = result["rebuild"]["rebuild_ratio"]
    if "lag" in result:
        f["lag_p99_ms"] = result["lag"]["lag_p99_ms"]
        f["lag_high_p99_ms"] = result["lag_high"]["lag_p99_ms"]
        f["projector_capacity_per_s"] = result["capacity"]["events_per_s"]
        for name in ("low", "half"):
            f[f"lag_{name}_p50_ms"] = result[f"lag_{name}"]["lag_p50_ms"]
            f[f"lag_{name}_p99_ms"] = result[f"lag_{name}"]["lag_p99_ms"]
    if "resume" in result:
        f["resume_tail_ratio"] = result["resume"]["resume_tail_ratio"]
    if "async_runs" in result:
        a, t = result["async_runs"], result["threaded_runs"]
        f["async_memory_per_run_kb"] = a["memory_per_run_kb"]
        f["intent_over_raw_ms"] = a["intent_over_raw_ms"]
        f["concurrent_runs_completed"] = min(a["completed"] / a["runs"], t["completed"] / t["runs"])
    if "conversation" in result:
        for name in SECTIONS["conversation"]:
            f[name] = result["conversation"][name]
    if "steps" in result:
        for name in ("steps_ratio", "steps_calls_per_s"):
            f[name] = result["steps"][name]
        f["steps_open_p99_over_idle_at_70_ms"] = result["steps_open_loop"]["p99_over_idle_at_70_ms"]
    if "streams" in result:
        f["stream_p99_ms"] = result["streams"]["stream_p99_ms"]
    if "encryption" in result:
        f["encryption_append_ratio"] = result["encryption"]["append_on_over_off"]
        f["encryption_steps_ratio"] = result["encryption"]["steps_on_over_off"]
    return f


def run_bench(settings: Settings, size: BenchSize | str = "quick", *, progress: TextIO | None = sys.stderr,
              plot: str | None = None, only: str | Collection[str] | None = None) -> dict[str, Any]:
    """Run the benchmarks (every section, or those named in ``only``) once at ``size`` and return one
    JSON-ready dict of figures and ratios.

    Raises:
        PlotUnavailable: ``plot`` asked for (and the resume section runs) without matplotlib.
        ConfigError: the settings replicate the bench's topics less than the brokers' own defaults
            (:func:`runlog.processors.bench._env.replication_mismatch`), or a topic could not be created;
            or ``only`` names the conversation section without the ``pydantic-ai`` extra installed.
    """
    sz = SIZES[size] if isinstance(size, str) else size
    sections = _sections(only)
    skipped: dict[str, str] = {}
    if "conversation" in sections and (why := conversation_unavailable()) is not None:
        if only is not None:
            raise ConfigError(f"bench: {why}")
        sections, skipped["conversation"] = tuple(s for s in sections if s != "conversation"), why
    if plot and "resume" in sections:
        require_plot()  # before the run, not after it
    kafka = kafka_replication(settings)
    problem = replication_mismatch(kafka)
    if problem is not None:
        raise ConfigError(f"bench: {problem}")
    tick: Callable[[str], None] = Progress(steps_of(sz, sections), progress)
    started = time.monotonic()
    env = BenchEnv(settings)
    speed = speed_index()  # before anything of the bench's own runs: the host, not the bench
    result: dict[str, Any] = {"size": sz.name, "tag": env.tag, "sections": list(sections),
                              "machine": machine(), "kafka": kafka, "speed": speed}
    if skipped:
        result["skipped"] = skipped
    try:
        if "append" in sections:
            result["append"] = bench_append(env, events=sz.append_events, runs=sz.append_runs,
                                            rounds=sz.rounds, tick=tick)
        if "intent" in sections:
            result["intent_latency"] = bench_intent(env, samples=sz.intent_samples, rounds=sz.rounds,
                                                    tick=tick)
        if "scale" in sections:
            result["scale"] = {"writer": bench_writer_scale(env, runs=sz.scale_runs, tick=tick,
                                                            events_per_run=sz.scale_events_per_run)}
        if "projector" in sections:
            proj, proj_settings, ids = bench_projector(env, events=sz.projector_events,
                                                       runs=sz.projector_runs, rounds=sz.projector_rounds,
                                                       marks=list(sz.projector_marks), tick=tick)
            result["projector"] = proj
        if "lag" in sections:
            if "projector" in result:
                result["capacity"] = {"events_per_s": result["projector"]["runlog_events_per_s"],
                                      "source": "projector section"}
            else:
                result["capacity"] = measure_capacity(env, events=sz.projector_events, runs=sz.projector_runs,
                                                      tick=tick)
            cap = result["capacity"]["events_per_s"]
            for name, share in (("low", 0.2), ("half", 0.5)):
                result[f"lag_{name}"] = bench_lag(env, rate=max(int(cap * share), 50), seconds=sz.lag_seconds,
                                                  runs=sz.lag_runs, within=ProjectorOptions().within,
                                                  tick=tick, name=f"lag-{name}")
                result[f"lag_{name}"]["share_of_capacity"] = share
            result["lag"] = bench_lag(env, rate=sz.lag_rate, seconds=sz.lag_seconds, runs=sz.lag_runs,
                                      within=ProjectorOptions().within, tick=tick)
            result["lag_high"] = bench_lag(env, rate=sz.lag_rate_high, seconds=sz.lag_seconds,
                                           runs=sz.lag_runs, within=ProjectorOptions().within, tick=tick,
                                           name="lag-high")
        if "resume" in sections:
            result["resume"] = bench_resume(env, lengths=list(sz.resume_lengths), rounds=sz.resume_rounds,
                                            tick=tick)
            result["resumer_group"] = bench_resumer_group(env, runs=sz.crashed_runs,
                                                          members=sz.resumer_members, tick=tick)
        if "projector" in sections:
            result["rebuild"] = bench_rebuild(env, proj_settings, rounds=sz.rounds, tick=tick)
            result["replays"] = bench_replays(env, proj_settings, workers=(1, 2), tick=tick)
            raw = result["rebuild"]["raw_events_per_s"]
            for p in result["replays"]["rebuild"]:  # the same raw consume + decode baseline, per core
                p["ratio"] = ratio(p["events_per_s"], raw)
                p["read_ratio"] = ratio(p["read_events_per_s"], raw)
                p["read_ratio_per_core"] = ratio(p["read_events_per_s"] / p["workers"], raw)
            group = [{"consumers": 1, "events_per_s": proj["runlog_events_per_s"]}]
            for k in sz.group_sizes:
                if k == 1:
                    continue
                g = run_group(env, proj_settings, ids, sz.projector_events, consumers=k, name=f"g{k}")
                group.append({"consumers": k, "events_per_s": g["events_per_s"]})
                tick(f"projector group of {k}")
            result.setdefault("scale", {})["projector_group"] = group
        if "concurrency" in sections:
            result["async_runs"] = bench_async_runs(env, runs=sz.async_runs,
                                                    raw_samples=sz.concurrency_raw_samples,
                                                    warmup=sz.concurrency_warmup, tick=tick)
            result["threaded_runs"] = bench_threaded_runs(env, runs=sz.threaded_runs,
                                                          raw_samples=sz.concurrency_raw_samples,
                                                          warmup=sz.concurrency_warmup, tick=tick)
        if "conversation" in sections:
            result["conversation"] = bench_conversation(env, calls=sz.conversation_calls, tick=tick)
        if "steps" in sections:
            result["steps"] = bench_steps(env, runs=sz.steps_runs, tick=tick)
            result["steps_open_loop"] = bench_open_loop(env, runs=max(sz.steps_runs),
                                                        seconds=sz.open_loop_seconds, tick=tick)
        if "streams" in sections:
            result["streams"] = bench_streams(env, runs=sz.streams_runs, rate=sz.streams_rate,
                                              seconds=sz.streams_seconds, tick=tick)
        if "fleet" in sections:
            result["fleet"] = bench_fleet(env, runs=sz.fleet_runs, rate=sz.fleet_rate, concurrency=8,
                                          tick=tick)
            result["limiter"] = bench_limiter(env, samples=sz.limiter_samples, tick=tick)
        if "encryption" in sections:
            result["encryption"] = bench_encryption(env, events=sz.append_events, runs=sz.append_runs,
                                                    rounds=sz.encryption_rounds,
                                                    append_rounds=sz.encryption_append_rounds,
                                                    steps_runs=sz.steps_runs[0], tick=tick)
    finally:
        env.close()
        tick("cleaned up")
        if isinstance(tick, Progress):
            tick.finish()
    result["speed_at_end"] = speed_index()
    figures = _figures(result)
    figures["speed_index"] = speed["index"]
    names = tuple(n for s in sections for n in SECTIONS[s])
    if "replays" in result:  # events/s by worker count (figures without a target)
        for kind in ("audit", "rebuild"):
            out_k = {str(p["workers"]): p["events_per_s"] for p in result["replays"][kind]}
            result[f"{kind}_events_per_s"] = out_k
    out: dict[str, Any] = {**figures, **result, "targets": targets_met(figures, names),
                           "seconds": time.monotonic() - started}
    if plot and "resume" in result:
        out["plot"] = plot_result(out, plot)
    return out
