"""Benchmarks of Runlog against the raw clients it is made of (``runlog bench``)."""

from processors.bench._sizes import SIZES, BenchSize
from processors.bench.harness import TARGETS, PlotUnavailable, plot_result, run_bench, targets_met

__all__ = ["SIZES", "TARGETS", "BenchSize", "PlotUnavailable", "plot_result", "run_bench", "targets_met"]
