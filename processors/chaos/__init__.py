"""``runlog chaos``: a mixed workload under random faults of every kind, then a count of what went wrong.

Split by responsibility: :mod:`.services` (private broker, Redis, Toxiproxy), :mod:`.app` and
:mod:`.worker` (the workflows and their worker process), :mod:`.workload` (runs in flight, signals),
:mod:`.fleet` (resumer and projector members), :mod:`.faults` (the scheduler), :mod:`.count` (the count),
:mod:`.report` (the text and JSON), :mod:`.run` (the phases).
"""

from typing import TYPE_CHECKING

from runlog.schemas.internal import lazy_names

if TYPE_CHECKING:
    from runlog.processors.chaos.count import Count
    from runlog.processors.chaos.faults import KINDS, Fault, Planned, Scheduler, plan
    from runlog.processors.chaos.report import as_json, render, verdict
    from runlog.processors.chaos.run import ChaosOptions, ChaosResult, run_chaos

# imported on first use: ``runlog`` builds its parser from ``faults.KINDS`` without loading the rest
__getattr__, __dir__ = lazy_names(__name__, {
    "Count": "runlog.processors.chaos.count",
    **dict.fromkeys(("KINDS", "Fault", "Planned", "Scheduler", "plan"), "runlog.processors.chaos.faults"),
    **dict.fromkeys(("as_json", "render", "verdict"), "runlog.processors.chaos.report"),
    **dict.fromkeys(("ChaosOptions", "ChaosResult", "run_chaos"), "runlog.processors.chaos.run"),
})

__all__ = ["KINDS", "ChaosOptions", "ChaosResult", "Count", "Fault", "Planned", "Scheduler", "as_json",
           "plan", "render", "run_chaos", "verdict"]
