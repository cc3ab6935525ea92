"""What the console reads, as plain blocking functions (the handlers run them on worker threads).

* the run list comes from the Redis projection (:class:`runlog.projections.RedisStore`);
* a run's page comes from the log: a :class:`RunFollower` feeds the run's records to the
  audit's :class:`~runlog.processors.audit.Auditor` (the one fold plus the audit's checks), so the
  console's timeline is ``runlog audit``'s view of the run, and it keeps following the
  partition from where it stopped;
* health comes from Kafka (consumer group offsets against high watermarks, the dead-letter
  topic) and from Redis (the namespace marker, the rebuild lock).

Nothing here writes: no group is joined or committed (the health's group offsets are asked of
the admin API; records and watermarks are read with :class:`runlog.projections.log_reader.LogReader`,
which assigns partitions), Redis is only read.

The run list is :mod:`runlog.processors.console._run_list`, a run's page
:mod:`runlog.processors.console._run_follower`, the health :mod:`runlog.processors.console._health`; their
names stay importable from here.
"""

from __future__ import annotations

from runlog.processors.console._health import DeadLetterView, GroupLag, Health, read_health
from runlog.processors.console._run_follower import (
    SHOWN_ATTRIBUTES,
    SHOWN_EVENTS,
    RunFollower,
    timeline_items,
)
from runlog.processors.console._run_list import ATTENTION, SCAN_LIMIT, RunRow, RunsPage, list_runs

__all__ = [
    "ATTENTION",
    "SCAN_LIMIT",
    "SHOWN_ATTRIBUTES",
    "SHOWN_EVENTS",
    "DeadLetterView",
    "GroupLag",
    "Health",
    "RunFollower",
    "RunRow",
    "RunsPage",
    "list_runs",
    "read_health",
    "timeline_items",
]
