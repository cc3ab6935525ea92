"""``runlog bench --only streams``: streamed deltas over many runs reach the relay subscriber, with
the latency figures the target is read from, and the bench's topics are removed afterwards."""

from __future__ import annotations

import json

import pytest
from confluent_kafka.admin import AdminClient

from runlog.processors.cli import main
from runlog.schemas.settings import Settings


@pytest.mark.integration
def test_bench_streams_delivers_every_delta_and_reports_its_latency(
        settings: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", settings.kafka_bootstrap_servers)
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    code = main(["bench", "--size", "tiny", "--only", "streams", "--json", "--quiet", "--plot", ""])
    doc = json.loads(capsys.readouterr().out)
    assert code in (0, 1)  # 1: the target missed on a loaded machine; the figures are still checked
    assert doc["sections"] == ["streams"] and set(doc["targets"]) == {"stream_p99_ms"}
    s = doc["streams"]
    assert s["runs"] == 10 and s["tokens"] >= 300 and s["received"] == s["tokens"]
    assert s["dropped"] == 0 and s["failed"] == 0
    assert s["stream_max_ms"] >= s["stream_p99_ms"] >= s["stream_p50_ms"] > 0
    assert doc["targets"]["stream_p99_ms"]["value"] == doc["stream_p99_ms"] == s["stream_p99_ms"]
    assert s["write_call_p99_us"] >= s["write_call_p50_us"] > 0
    assert s["appends"] > 0  # the run's log timed beside the stream, and before it
    assert s["append_streaming_p99_ms"] >= s["append_streaming_p50_ms"] > 0
    assert s["append_idle_p99_ms"] >= s["append_idle_p50_ms"] > 0
    left = [t for t in AdminClient(settings.admin_config()).list_topics(timeout=10).topics
            if t.startswith(f"bench-{doc['tag']}-")]
    assert left == []
