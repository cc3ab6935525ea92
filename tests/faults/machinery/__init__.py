"""The fault suite's machinery: crash points, the crash matrix runner, the JSON report."""

from tests.faults.machinery.matrix import (
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
from tests.faults.machinery.points import Boundary, boundaries, crash_points, expected_prefix, subject_of
from tests.faults.machinery.report import COUNTERS, PointEntry, write_section

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
