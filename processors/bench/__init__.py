"""Benchmarks of Runlog against the raw clients it is made of (``runlog bench``)."""

from runlog.processors.bench._sizes import SIZES, BenchSize
from runlog.processors.bench.harness import TARGETS, PlotUnavailable, plot_result, run_bench, targets_met

__all__ = ["SIZES", "TARGETS", "BenchSize", "PlotUnavailable", "plot_result", "run_bench", "targets_met"]
