"""Prometheus metrics of the projector and the resumer, with the ``prometheus_client`` library.

Each component gets its own :class:`~prometheus_client.CollectorRegistry` (never the
library's global default one), so several components, or several tests, in one process
do not collide. :class:`MetricsServer` serves one registry's ``GET /metrics`` from a
daemon thread (:func:`prometheus_client.start_http_server`).

The SDK side (``runlog_writer_*``) lives in :mod:`runlog.producers.log._metrics`: a
:class:`~runlog.producers.log._writer.RunWriter` counts into a registry only when it is given one.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from runlog.projections.batch import BatchResult

__all__ = ["RECOVERY_REASONS", "RESUME_OUTCOMES", "MetricsServer", "ProjectorMetrics", "ResumerMetrics"]

RECOVERY_REASONS = ("lost_at_start", "lost", "went_back")
"""``runlog_projector_recoveries_total`` reasons: Redis lost the namespace before the projector
started (with offsets committed), or while it ran, or went back (a run's stored state older than
one applied: a failover lost acknowledged writes)."""

RESUME_OUTCOMES = ("completed", "blocked", "contended", "failed", "cancelled", "nothing_to_do", "waiting",
                   "not_mine", "not_served", "queued", "unknown_run", "error")
"""``runlog_resumer_resumes_total`` outcomes: a :class:`~runlog.processors.resume.ResumeOutcome` result,
``unknown_run`` (neither Redis nor the log knows the run) or ``error`` (the resume raised)."""

_APPLY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
_RESUME_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 900.0, 3600.0)


class ProjectorMetrics:
    """The projector's metrics (``runlog_projector_*``) in ``registry`` (a new one when None)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.records = Counter("runlog_projector_records_total", "Records read from the events topic.",
                               registry=r)
        self.applied = Counter("runlog_projector_events_applied_total",
                               "Events the fold accepted and Redis stored.", registry=r)
        self.duplicates = Counter("runlog_projector_duplicates_total",
                                  "Records that were duplicates or redeliveries (already folded).",
                                  registry=r)
        self.rejected = Counter("runlog_projector_rejected_total",
                                "Events the fold rejected, by reason (fenced: stale_epoch, "
                                "lease_epoch_not_higher; out of order: seq_gap, seq_replayed).",
                                ["reason"], registry=r)
        self.dead_letters = Counter("runlog_projector_dead_letters_total",
                                    "Undecodable records sent to the dead-letter topic, by reason.",
                                    ["reason"], registry=r)
        self.conflicts = Counter("runlog_projector_conflicts_total",
                                 "Run updates re-folded after a stale cache.", registry=r)
        self.batches = Counter("runlog_projector_batches_total",
                               "Batches applied and published (their offsets may be committed).", registry=r)
        self.apply_seconds = Histogram("runlog_projector_batch_apply_seconds",
                                       "Seconds to fold one batch and write it to Redis (a rebuild after "
                                       "a lost namespace included).", buckets=_APPLY_BUCKETS, registry=r)
        self.lag = Gauge("runlog_projector_consumer_lag",
                         "Records of an assigned events partition not processed yet (high watermark "
                         "minus next offset to process).", ["partition"], registry=r)
        self.gap_records = Counter("runlog_projector_gap_records_total",
                                   "Records the consumer skipped (across a rebalance) that the projector "
                                   "read from the log: applied before the batch after them, or delivered "
                                   "again at the end of a stalled partition.", registry=r)
        self.batch_failures = Counter("runlog_projector_batch_failures_total",
                                      "Failed attempts to apply a batch (Redis unreachable past the "
                                      "failover window, the group coordinator moving): each is tried "
                                      "again, or dropped by a rebalance that fetches its records again.",
                                      registry=r)
        self.batch_retrying = Gauge("runlog_projector_batch_retrying",
                                    "Seconds the batch in hand has been failing and tried again (0: none "
                                    "failing); alert when it stays above a minute.", registry=r)
        self.run_heals = Counter("runlog_projector_run_heals_total",
                                 "Runs whose projected state had a seq gap and were re-folded from "
                                 "their partition.", registry=r)
        self.recoveries = Counter("runlog_projector_recoveries_total",
                                  "Rebuilds of the Redis namespace from the log, by reason.",
                                  ["reason"], registry=r)
        for reason in RECOVERY_REASONS:
            self.recoveries.labels(reason)
        self.model_calls = Counter("runlog_model_calls_total",
                                   "Model calls whose usage the fold accepted (recorded once each: a "
                                   "reused recorded call is not counted again), by workflow and model.",
                                   ["workflow", "model"], registry=r)
        self.model_tokens = Counter("runlog_model_tokens_total",
                                    "Tokens of those calls by kind: input (all input tokens, cached ones "
                                    "included), output, cache_read, cache_write.",
                                    ["workflow", "model", "kind"], registry=r)
        self.model_cost = Counter("runlog_model_cost_usd_total",
                                  "Cost of those calls in US dollars, from the App's price table (calls of "
                                  "a model without a price add nothing here).", ["workflow", "model"],
                                  registry=r)
        self.limit_calls = Counter("runlog_limit_calls_total",
                                   "Calls counted against a rate limit (a tool's limit=), by limit key, once "
                                   "each as the fold accepts their TOOL_RESULT.", ["limit"], registry=r)
        self.limit_wait = Histogram("runlog_limit_wait_seconds",
                                    "How long those calls waited for their limit (limit_wait_ms: in their "
                                    "thread and durably).", ["limit"], registry=r,
                                    buckets=(0.0, 0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600))
        self.limit_refusals = Counter("runlog_limit_refusals_total",
                                      "Provider refusals (429, RateLimited) of those calls, by limit key.",
                                      ["limit"], registry=r)
        self.limit_durable_waits = Counter("runlog_limit_durable_waits_total",
                                           "Durable waits for a rate limit begun (RUN_WAITING for "
                                           "runlog.limit: the run let go until its limit fits).",
                                           ["limit"], registry=r)
        self._lag_partitions: set[str] = set()

    def observe_batch(self, res: BatchResult, records: int, seconds: float | None = None) -> None:
        """Count one batch's outcomes (``seconds``: its fold and Redis write)."""
        self.batches.inc()
        self.records.inc(records)
        self.applied.inc(res.applied)
        self.duplicates.inc(res.outcomes["duplicate"])
        self.conflicts.inc(res.conflicts)
        for reason, n in res.rejected.items():
            self.rejected.labels(reason).inc(n)
        for dl in res.dead_letters:
            self.dead_letters.labels(dl.reason).inc()
        if seconds is not None:
            self.apply_seconds.observe(seconds)
        for workflow, u in res.usage:
            self.model_calls.labels(workflow, u.model).inc()
            for kind, n in (("input", u.input_tokens), ("output", u.output_tokens),
                            ("cache_read", u.cache_read_tokens), ("cache_write", u.cache_write_tokens)):
                self.model_tokens.labels(workflow, u.model, kind).inc(n)
            if u.cost_nanos is not None:
                self.model_cost.labels(workflow, u.model).inc(u.cost_nanos / 1e9)
        for lim in res.limits:
            if lim.parked:
                self.limit_durable_waits.labels(lim.key).inc()
                continue
            self.limit_calls.labels(lim.key).inc()
            self.limit_wait.labels(lim.key).observe(lim.waited_ms / 1000)
            if lim.refusals:
                self.limit_refusals.labels(lim.key).inc(lim.refusals)

    def set_lag(self, lags: Iterable[tuple[int, int | None]]) -> None:
        """The lag of every assigned partition (None: not known yet, the last value stays);
        partitions no longer assigned are dropped."""
        now: set[str] = set()
        for partition, lag in lags:
            label = str(partition)
            if lag is not None:
                self.lag.labels(label).set(lag)
            elif label not in self._lag_partitions:
                continue
            now.add(label)
        for gone in self._lag_partitions - now:
            self.lag.remove(gone)
        self._lag_partitions = now


class ResumerMetrics:
    """The resumer's metrics (``runlog_resumer_*``) in ``registry`` (a new one when None).

    The resumer's own :class:`~runlog.producers.log._writer.RunWriter` counts its appends into the same
    registry
    (``runlog_writer_*``)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = r = registry if registry is not None else CollectorRegistry()
        self.requests = Counter("runlog_resumer_requests_total",
                                "Records read from the resume topic (undecodable ones included).", registry=r)
        self.resumes = Counter("runlog_resumer_resumes_total", "Resumes run, by outcome.", ["outcome"],
                               registry=r)
        self.resume_seconds = Histogram("runlog_resumer_resume_seconds",
                                        "Seconds one resume took (planning, lease, reconciling and the "
                                        "rest of the run).", buckets=_RESUME_BUCKETS, registry=r)
        self.retries = Counter("runlog_resumer_retries_total",
                               "Resumes of contended runs retried once their lease could have expired.",
                               registry=r)
        self.retries_abandoned = Counter("runlog_resumer_retries_abandoned_total",
                                         "Contended runs given up after CONTENDED_RETRIES retries "
                                         "(the sweep remains the backstop).", registry=r)
        self.sweeps = Counter("runlog_resumer_sweeps_total", "Sweeps for runs whose worker died.", registry=r)
        self.sweep_requested = Counter("runlog_resumer_sweep_requested_total",
                                       "Resume requests the sweep and the timers appended, by reason "
                                       "(lease_expired, wait_timed_out, timer_due, children_ended).",
                                       ["reason"],
                                       registry=r)
        self.dead_letters = Counter("runlog_resumer_dead_letters_total",
                                    "Resume requests sent to the dead-letter topic, by reason.", ["reason"],
                                    registry=r)
        self.waiting_for_version = Gauge(
            "runlog_resumer_runs_waiting_for_version",
            "Runs parked for a member serving their workflow@version (as of this member's last look; "
            "waiting with no live member: no member serves it).", ["workflow", "version"], registry=r)
        self.version_members = Gauge(
            "runlog_resumer_version_members",
            "Live resumer members serving a workflow@version (as of this member's last look).",
            ["workflow", "version"], registry=r)
        self.open_runs = Gauge(
            "runlog_resumer_open_runs",
            "Open runs (PENDING, RUNNING, WAITING, BLOCKED, FAILED) of a workflow@version by status, "
            "from the projection, refreshed every 10 s (one member counts per period, the others read its "
            "count; 0 once none is left: the version can leave the App).", ["workflow", "version", "status"],
            registry=r)
        for outcome in RESUME_OUTCOMES:
            self.resumes.labels(outcome)
        for reason in ("lease_expired", "wait_timed_out", "timer_due", "children_ended"):
            self.sweep_requested.labels(reason)


class MetricsServer:
    """Serves one registry's ``GET /metrics`` from a daemon thread; ``port=0`` picks a free port;
    ``host`` is the interface (``RUNLOG_METRICS_HOST``; loopback by default)."""

    def __init__(self, registry: CollectorRegistry, port: int, host: str = "127.0.0.1") -> None:
        self._server, self._thread = start_http_server(port, addr=host, registry=registry)
        self.port = int(self._server.server_port)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)
