"""The projector's Prometheus endpoint after real work: ``runlog project`` on the real broker and Redis,
scraped over HTTP; every counter moved by what was produced."""

from __future__ import annotations

import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from runlog.schemas import RunEvent, Settings
from tests.unit.projections.runlogs import RunBuilder, full_run, zombie

from .harness import (
    converges,
    free_port,
    garbage,
    interleave,
    produce,
    reference,
    start_projector,
    stop,
    wait_until,
)

pytestmark = pytest.mark.integration

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(port: int) -> Samples | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:  # not listening yet
        return None
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in text_string_to_metric_families(text) for s in f.samples}


def _value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _by_label(samples: Samples, name: str, label: str) -> dict[str, float]:
    return {dict(lbl)[label]: v for (n, lbl), v in samples.items() if n == name}


def test_projector_metrics_count_what_was_produced(
    topics: Settings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    runs = [full_run(f"m-{i:02d}", stages=1 + i % 6) for i in range(16)]
    b = RunBuilder("fenced-run").start().stage("research").lease(2).stage("verify")
    stale = [zombie(b.events[3], epoch=1, seq=s) for s in (b.seq + 1, b.seq + 2, 5)]  # a fenced writer
    gap = zombie(b.events[3], epoch=2, seq=b.seq + 3)  # the current writer, two seqs ahead
    again = runs[0][-2:]  # appended twice: same seq, same content
    junk = garbage(30)  # 10 each: unknown_framing, unknown_schema, truncated
    items: list[RunEvent | tuple[bytes | None, bytes]] = [*interleave([*runs, b.events]), *stale, gap, *again,
                                                          *junk]
    produced = produce(topics, items)
    applied = sum(len(r) for r in runs) + len(b.events)
    assert produced == applied + 3 + 1 + 2 + 30

    port = free_port()
    proc = start_projector(topics, f"{topics.topic_prefix}proj", log=tmp_path / "p.log",
                           RUNLOG_METRICS_PORT=str(port))
    seen: Samples = {}

    def scraped(cond: Callable[[Samples], object]) -> bool:
        nonlocal seen
        s = _scrape(port)
        if s is None:
            return False
        seen = s
        return bool(cond(s))

    try:
        assert wait_until(lambda: scraped(lambda s: _value(s, "runlog_projector_records_total") >= produced),
                          90, every=0.5), f"records seen: {_value(seen, 'runlog_projector_records_total')}"
        # the lag timer (every 5 s) reports every assigned partition caught up
        assert wait_until(lambda: scraped(lambda s: (lag := _by_label(s, "runlog_projector_consumer_lag",
                                                                      "partition"))
                                          and not any(lag.values())), 30, every=1.0), seen
        s = seen
        assert _value(s, "runlog_projector_records_total") == produced
        assert _value(s, "runlog_projector_events_applied_total") == applied
        assert _by_label(s, "runlog_projector_rejected_total", "reason") == {"stale_epoch": 3, "seq_gap": 1}
        assert _value(s, "runlog_projector_duplicates_total") == 2
        assert _by_label(s, "runlog_projector_dead_letters_total", "reason") == \
            {"unknown_framing": 10, "unknown_schema": 10, "truncated": 10}
        batches = _value(s, "runlog_projector_batches_total")
        assert batches >= 1
        assert _value(s, "runlog_projector_batch_apply_seconds_count") == batches
        assert _value(s, "runlog_projector_batch_apply_seconds_bucket", le="+Inf") == batches
        assert _value(s, "runlog_projector_batch_apply_seconds_sum") > 0
        assert set(_by_label(s, "runlog_projector_consumer_lag", "partition")) <= \
            {str(p) for p in range(topics.partitions)}
        assert _by_label(s, "runlog_projector_recoveries_total", "reason") == \
            {"lost_at_start": 0, "lost": 0, "went_back": 0}

        # Redis loses the namespace while the projector runs: the next batch rebuilds it from the log
        keys = list(redis_client.scan_iter(match=f"{topics.redis_prefix}:*", count=1000))
        redis_client.delete(*keys)
        later = full_run("after-loss", stages=2)
        produce(topics, later)
        assert wait_until(lambda: scraped(lambda s: _value(s, "runlog_projector_recoveries_total",
                                                           reason="lost") >= 1), 60, every=0.5), seen
        ref = reference(topics, redis_client)
        assert converges(topics, redis_client, ref, timeout=60) == []
        assert wait_until(lambda: scraped(lambda s: _value(s, "runlog_projector_records_total")
                                          >= produced + len(later)), 30, every=0.5), seen
        assert _value(seen, "runlog_projector_records_total") == produced + len(later)
        assert _by_label(seen, "runlog_projector_recoveries_total", "reason") == \
            {"lost_at_start": 0, "lost": 1, "went_back": 0}
        assert proc.poll() is None, "the projector stopped"
    finally:
        stop(proc)
