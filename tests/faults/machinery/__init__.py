"""The fault suite's machinery: crash points, the crash matrix runner, the JSON report."""

from processors.faults.matrix import (
    CONTENT_EXPECT,
    CrashMatrix,
    Expectations,
    MatrixError,
    Reference,
    RoutingWorld,
    projection_mismatches,
    start_projector,
    worker_env,
)
from processors.faults.points import Boundary, boundaries, crash_points, expected_prefix, subject_of
from processors.faults.report import COUNTERS, PointEntry, write_section

__all__ = [
    "CONTENT_EXPECT",
    "COUNTERS",
    "Boundary",
    "CrashMatrix",
    "Expectations",
    "MatrixError",
    "PointEntry",
    "Reference",
    "RoutingWorld",
    "boundaries",
    "crash_points",
    "expected_prefix",
    "projection_mismatches",
    "start_projector",
    "subject_of",
    "worker_env",
    "write_section",
]
