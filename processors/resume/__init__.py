"""Resume: continue crashed runs from the facts on the log, never from a model's memory.

Delivery: a resume request on the resume topic is committed only after its resume ended (at
least once); a run is resumed by one writer at a time (a lease at a new epoch, confirmed on the
log before anything else), so a request seen twice resumes nothing twice. An effect intent
without a result is settled by its tool's replay policy before the run goes on.

* :mod:`runlog.processors.resume.resumer`: :class:`Resumer`, one resume (plan, take over, continue).
* :mod:`runlog.processors.resume.facts`: what a plan reads, through the ports.
* :mod:`runlog.processors.resume.plan`: what to do, as pure functions of those facts.
* :mod:`runlog.processors.resume.ports`: the run's events (Kafka, or in memory for unit tests).
* :mod:`runlog.processors.resume.service`: :class:`ResumerService`, the ``runlog resumer`` process
  (consumes the resume topic in a consumer group, sweeps for runs nobody resumes, dead-letters
  requests it cannot read).
* :mod:`runlog.processors.resume.request`: :func:`request_resume`, a request on the resume topic.
"""

from runlog.processors.resume.request import request_resume
from runlog.processors.resume.resumer import (
    App,
    EffectPlan,
    ResumeOutcome,
    ResumePlan,
    Resumer,
    UnknownRun,
    describe,
    load_app,
    plan_effect,
)
from runlog.processors.resume.service import (
    CONTENDED_RETRIES,
    RETRY_MARGIN_S,
    ResumerService,
    SweepReport,
    app_id,
    group_id,
)

__all__ = [
    "CONTENDED_RETRIES",
    "RETRY_MARGIN_S",
    "App",
    "EffectPlan",
    "ResumeOutcome",
    "ResumePlan",
    "Resumer",
    "ResumerService",
    "SweepReport",
    "UnknownRun",
    "app_id",
    "describe",
    "group_id",
    "load_app",
    "plan_effect",
    "request_resume",
]
