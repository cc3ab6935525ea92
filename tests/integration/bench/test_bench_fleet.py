"""``runlog bench --only fleet``: submitted runs reach RUN_STARTED on a worker at the offered rate, a
rate-limit take is timed beside a raw Redis round trip, and the bench's topics are removed afterwards
(the submissions, schema and schedule topics included)."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient

from runlog.processors.cli import main
from runlog.schemas.settings import Settings


@pytest.mark.integration
def test_bench_fleet_reports_submit_to_start_and_the_limiter_overhead(
        settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", settings.kafka_bootstrap_servers)
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    code = main(["bench", "--size", "tiny", "--only", "fleet", "--json", "--quiet", "--plot", ""])
    doc = json.loads(capsys.readouterr().out)
    assert code == 0 and doc["sections"] == ["fleet"] and doc["targets"] == {}
    f = doc["fleet"]
    assert f["runs"] == 40 and f["offered_per_s"] == 40 and f["achieved_per_s"] > 0
    assert f["submit_to_started_p99_ms"] >= f["submit_to_started_p50_ms"] > 0
    assert f["submit_p99_ms"] >= f["submit_p50_ms"] > 0
    lim = doc["limiter"]
    assert lim["take_us"] > 0 and lim["raw_roundtrip_us"] > 0
    assert lim["take_over_raw_ratio"] == pytest.approx(lim["take_us"] / lim["raw_roundtrip_us"], rel=1e-3,
                                                       abs=1e-4)  # the JSON rounds to 4 decimals
    left = [t for t in AdminClient(settings.admin_config()).list_topics(timeout=10).topics
            if t.startswith(f"bench-{doc['tag']}-")]
    assert left == []
