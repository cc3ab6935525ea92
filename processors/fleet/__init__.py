"""A fleet: clients submit runs, workers start and execute them, anyone awaits their results.

* :class:`Client` (``runlog.Client``): submit a run by workflow name, await its result, read its status,
  signal or cancel it, list runs; needs the broker and Redis, not the workflow code.
* :class:`Worker` (``runlog worker --app M:A``): starts submitted runs (each exactly once across the
  fleet, at most ``concurrency`` at a time per process) and resumes the runs nobody continues.

See ``docs/how-to/fleet.md``.
"""

from runlog.processors.fleet._client import SUBMITTED, Client, RunInfo, SubmittedRun
from runlog.processors.fleet._intake import IntakeMetrics, SubmissionIntake, Taken
from runlog.processors.fleet._worker import Worker

__all__ = ["SUBMITTED", "Client", "IntakeMetrics", "RunInfo", "SubmissionIntake", "SubmittedRun", "Taken",
           "Worker"]
