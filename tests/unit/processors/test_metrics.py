"""Metrics with prometheus_client: one registry per component, the batch counts, the HTTP endpoint."""

from __future__ import annotations

import urllib.request
from collections import Counter

from prometheus_client import REGISTRY, CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from runlog.processors.metrics import MetricsServer, ProjectorMetrics, ResumerMetrics
from runlog.producers.log._metrics import WriterMetrics
from runlog.projections.batch import BatchResult, DeadLetter, RawRecord


def _dead(reason: str, offset: int) -> DeadLetter:
    return DeadLetter(RawRecord("t.events", 0, offset, b"k", b"junk"), reason, "detail")


def test_a_batch_moves_the_projector_counters_by_its_outcomes() -> None:
    m = ProjectorMetrics()
    res = BatchResult(outcomes=Counter({"accepted": 7, "duplicate": 2, "rejected_fenced": 3,
                                        "rejected_out_of_order": 1}),
                      rejected=Counter({"stale_epoch": 3, "seq_gap": 1}),
                      dead_letters=[_dead("truncated", 10), _dead("truncated", 11),
                                    _dead("unknown_schema", 12)],
                      conflicts=1)
    m.observe_batch(res, 16, 0.004)
    m.observe_batch(BatchResult(outcomes=Counter({"accepted": 1})), 1, 0.002)
    v = m.registry.get_sample_value
    assert v("runlog_projector_batches_total") == 2
    assert v("runlog_projector_records_total") == 17
    assert v("runlog_projector_events_applied_total") == 8
    assert v("runlog_projector_duplicates_total") == 2
    assert v("runlog_projector_conflicts_total") == 1
    assert v("runlog_projector_rejected_total", {"reason": "stale_epoch"}) == 3
    assert v("runlog_projector_rejected_total", {"reason": "seq_gap"}) == 1
    assert v("runlog_projector_dead_letters_total", {"reason": "truncated"}) == 2
    assert v("runlog_projector_dead_letters_total", {"reason": "unknown_schema"}) == 1
    assert v("runlog_projector_batch_apply_seconds_count") == 2
    assert v("runlog_projector_batch_apply_seconds_bucket", {"le": "0.0025"}) == 1
    assert v("runlog_projector_batch_apply_seconds_bucket", {"le": "0.005"}) == 2
    assert abs((v("runlog_projector_batch_apply_seconds_sum") or 0) - 0.006) < 1e-9
    # the recovery reasons are there before any recovery
    assert v("runlog_projector_recoveries_total", {"reason": "lost"}) == 0
    assert v("runlog_projector_recoveries_total", {"reason": "lost_at_start"}) == 0


def test_lag_of_revoked_partitions_is_dropped() -> None:
    m = ProjectorMetrics()
    m.set_lag([(0, 5), (1, 0), (2, None)])  # 2: no high watermark yet, never labelled
    v = m.registry.get_sample_value
    assert (v("runlog_projector_consumer_lag", {"partition": "0"}),
            v("runlog_projector_consumer_lag", {"partition": "1"}),
            v("runlog_projector_consumer_lag", {"partition": "2"})) == (5, 0, None)
    m.set_lag([(0, None), (2, 3)])  # 1 revoked; 0 unknown now: keeps its last value
    assert (v("runlog_projector_consumer_lag", {"partition": "0"}),
            v("runlog_projector_consumer_lag", {"partition": "1"}),
            v("runlog_projector_consumer_lag", {"partition": "2"})) == (5, None, 3)


def test_components_have_registries_of_their_own_never_the_global_one() -> None:
    a, b = ProjectorMetrics(), ProjectorMetrics()  # no "Duplicated timeseries" error
    r1, r2 = ResumerMetrics(), ResumerMetrics()
    a.applied.inc(3)
    assert b.registry.get_sample_value("runlog_projector_events_applied_total") == 0
    r1.resumes.labels("completed").inc()
    assert r2.registry.get_sample_value("runlog_resumer_resumes_total", {"outcome": "completed"}) == 0
    assert not [n for n in REGISTRY._names_to_collectors if n.startswith("runlog_")]


def test_writers_sharing_a_registry_share_its_metrics() -> None:
    reg = CollectorRegistry()
    w1, w2 = WriterMetrics.of(reg), WriterMetrics.of(reg)
    assert w1 is w2 and WriterMetrics.of(CollectorRegistry()) is not w1
    w1.appends.inc()
    w1.confirmed_sync.observe(0.003)
    assert reg.get_sample_value("runlog_writer_appends_total") == 1
    assert reg.get_sample_value("runlog_writer_confirmed_append_seconds_count", {"mode": "sync"}) == 1
    assert reg.get_sample_value("runlog_writer_confirmed_append_seconds_count", {"mode": "async"}) == 0


def test_the_server_exposes_its_registry_in_the_text_format() -> None:
    m = ResumerMetrics()
    m.resumes.labels("blocked").inc(2)
    m.dead_letters.labels("unknown_run").inc()
    server = MetricsServer(m.registry, 0, host="127.0.0.1")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5) as r:
            assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
            text = r.read().decode()
    finally:
        server.close()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["runlog_resumer_resumes"].type == "counter"
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value
               for f in families.values() for s in f.samples}
    assert samples[("runlog_resumer_resumes_total", (("outcome", "blocked"),))] == 2
    assert samples[("runlog_resumer_resumes_total", (("outcome", "completed"),))] == 0
    assert samples[("runlog_resumer_dead_letters_total", (("reason", "unknown_run"),))] == 1
    assert families["runlog_resumer_resume_seconds"].type == "histogram"


def test_the_console_reads_the_projector_endpoint() -> None:
    import asyncio

    from runlog.processors.console._views import _projector_metrics

    m = ProjectorMetrics()
    m.recoveries.labels("lost").inc()
    m.observe_batch(BatchResult(dead_letters=[_dead("truncated", 1), _dead("key_mismatch", 2)]), 2)
    m.set_lag([(0, 3), (5, 4)])
    server = MetricsServer(m.registry, 0, host="127.0.0.1")
    try:
        doc = asyncio.run(_projector_metrics(f"http://127.0.0.1:{server.port}/metrics"))
    finally:
        server.close()
    assert doc["error"] == ""
    assert doc["recoveries"] == {"lost_at_start": 0.0, "lost": 1.0, "went_back": 0.0}
    assert (doc["dead_letters"], doc["lag"]) == (2.0, 7.0)


def test_model_usage_is_counted_per_workflow_and_model_once_per_accepted_event() -> None:
    """The projector's ``runlog_model_*`` counters move by the usage of the events the fold accepted:
    a batch delivered again (its events duplicates) adds nothing; a model without a price adds
    tokens and calls, no cost."""
    from runlog.projections import BatchProjector, MemoryStore
    from runlog.schemas import Codec, EventType, RunEvent, StageSpec, Usage, WorkflowSpec

    codec = Codec()
    wf = WorkflowSpec("shop", "1", (StageSpec("ask"),))
    events = [RunEvent("r1", 1, 1, EventType.RUN_STARTED, 1, workflow=wf),
              RunEvent("r1", 2, 1, EventType.TOOL_RESULT, 2, stage="ask", call_id="ask/m/0",
                       usage=Usage("a:priced", 100, 10, 40, 0, 2_500)),
              RunEvent("r1", 3, 1, EventType.TOOL_RESULT, 3, stage="ask", call_id="ask/m/1",
                       usage=Usage("a:free", 7, 3))]
    records = [RawRecord("t.events", 0, i, b"r1", codec.encode(e)) for i, e in enumerate(events)]
    proj, m = BatchProjector(MemoryStore(), codec), ProjectorMetrics()
    for _ in range(2):  # the second delivery folds to duplicates
        m.observe_batch(proj.process(records), len(records))
    def v(name: str, model: str, **labels: str) -> float | None:
        return m.registry.get_sample_value(name, {"workflow": "shop", "model": model, **labels})

    assert v("runlog_model_calls_total", "a:priced") == 1 and v("runlog_model_calls_total", "a:free") == 1
    assert v("runlog_model_tokens_total", "a:priced", kind="input") == 100
    assert v("runlog_model_tokens_total", "a:priced", kind="cache_read") == 40
    assert v("runlog_model_tokens_total", "a:free", kind="output") == 3
    assert v("runlog_model_cost_usd_total", "a:priced") == 2_500 / 1e9
    assert v("runlog_model_cost_usd_total", "a:free") is None


def test_rate_limit_waits_are_counted_per_limit_once_per_accepted_event() -> None:
    """``runlog_limit_*`` move by what the accepted events say of calls' rate limits: a call's
    ``TOOL_RESULT`` (its wait and 429s), a durable wait's ``RUN_WAITING``; a redelivery adds nothing."""
    from runlog.projections import BatchProjector, MemoryStore
    from runlog.schemas import Codec, EventType, RunEvent, StageSpec, WorkflowSpec

    codec = Codec()
    wf = WorkflowSpec("shop", "1", (StageSpec("ask"),))
    lim = {"limit": "openai:gpt"}
    events = [RunEvent("r1", 1, 1, EventType.RUN_STARTED, 1, workflow=wf),
              RunEvent("r1", 2, 1, EventType.RUN_WAITING, 2, stage="ask", call_id="ask/m/0",
                       attributes={**lim, "signal": "runlog.limit", "deadline_ms": "9", "since_ms": "2"}),
              RunEvent("r1", 3, 2, EventType.LEASE_ACQUIRED, 3),
              RunEvent("r1", 4, 2, EventType.TOOL_RESULT, 4, stage="ask", call_id="ask/m/0",
                       attributes={**lim, "limit_wait_ms": "7000", "rate_limited": "2"}),
              RunEvent("r1", 5, 2, EventType.TOOL_RESULT, 5, stage="ask", call_id="ask/other/1")]
    records = [RawRecord("t.events", 0, i, b"r1", codec.encode(e)) for i, e in enumerate(events)]
    proj, m = BatchProjector(MemoryStore(), codec), ProjectorMetrics()
    for _ in range(2):  # the second delivery folds to duplicates
        m.observe_batch(proj.process(records), len(records))

    def v(name: str) -> float | None:
        return m.registry.get_sample_value(name, {"limit": "openai:gpt"})

    assert v("runlog_limit_durable_waits_total") == 1
    assert v("runlog_limit_calls_total") == 1  # the call without a limit is not counted
    assert v("runlog_limit_refusals_total") == 2
    assert v("runlog_limit_wait_seconds_sum") == 7.0
    assert m.registry.get_sample_value("runlog_limit_wait_seconds_bucket",
                                       {"limit": "openai:gpt", "le": "5.0"}) == 0
