"""Benchmarks of Runlog against the raw clients it is made of (``runlog bench``)."""

from processors.bench._png import Panel, encode_png, line_chart
from processors.bench._sizes import SIZES, BenchSize
from processors.bench.harness import TARGETS, run_bench, targets_met

__all__ = ["SIZES", "TARGETS", "BenchSize", "Panel", "encode_png", "line_chart", "run_bench", "targets_met"]
