"""``runlog bench --size tiny --json`` runs end to end and reports every figure as a number."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import redis

from runlog.processors.cli import main
from runlog.schemas.settings import Settings

KEYS = ("append_ratio", "intent_latency_ratio", "projector_ratio", "lag_p99_ms", "lag_high_p99_ms",
        "resume_tail_ratio",
        "rebuild_ratio", "async_memory_per_run_kb", "intent_over_raw_ms", "concurrent_runs_completed",
        "steps_ratio", "steps_calls_per_s", "lag_low_p50_ms", "lag_low_p99_ms", "lag_half_p99_ms",
        "steps_open_p99_over_idle_at_70_ms")
CONCURRENCY = ("async_memory_per_run_kb", "intent_over_raw_ms", "concurrent_runs_completed")


def _check_concurrent(doc: dict[str, Any]) -> None:
    """The many-runs-in-one-process figures of both sides: present, numbers, sane (no timings asserted)."""
    for side in ("async_runs", "threaded_runs"):
        r = doc[side]
        print(side, {k: r[k] for k in ("runs", "completed", "runs_per_s", "events_per_s", "intent_p50_ms",
                                       "intent_p99_ms", "raw_p50_ms", "intent_over_raw_ms",
                                       "memory_per_run_kb")})
        assert r["completed"] == r["runs"] > 0 and r["failed"] == 0, r["errors"]
        assert r["parked"] == r["runs"]  # memory was sampled with every run open at once
        # RUN_STARTED .. RUN_COMPLETED of the 2-stage, 4-call workflow: 16 events a run, all on the log
        assert r["events"] == 16 * r["runs"] == r["delivered"] > 0
        assert r["runs_per_s"] > 0 and r["events_per_s"] > 0
        assert r["intent_samples"] == r["runs"]  # every run's EFFECT_INTENT was confirmed and timed
        assert r["intent_p99_ms"] >= r["intent_p50_ms"] > 0
        assert r["raw_p99_ms"] >= r["raw_p50_ms"] > 0
        assert r["memory_per_run_kb"] > 0
    assert doc["async_memory_per_run_kb"] == doc["async_runs"]["memory_per_run_kb"]
    assert doc["intent_over_raw_ms"] == doc["async_runs"]["intent_over_raw_ms"]
    assert doc["concurrent_runs_completed"] == 1


def _check_steps(doc: dict[str, Any]) -> None:
    """The steps section: every run of each side completed, the events each run appends (RUN_STARTED,
    LEASE_ACQUIRED, per stage STAGE_STARTED and VERIFIED, per call TOOL_CALLED and TOOL_RESULT, the
    effect's EFFECT_INTENT and EFFECT_RESULT, RUN_COMPLETED ...) produced by the baseline too, and
    the ratios are the calls per second side by side (no timings asserted)."""
    st = doc["steps"]
    assert st["points"] and [p["runs"] for p in st["points"]] == [50]
    for p in st["points"]:
        raw = p["raw"]
        for side in ("asyncio", "threads"):
            r = p[side]
            assert r["completed"] == r["runs"] == p["runs"] and r["failed"] == 0, r["errors"]
            assert r["calls"] == 8 * r["runs"] and r["cpu_us_per_call"] > 0
            assert r["events"] == 24 * r["runs"], r  # every event of every run on the log
            # the JSON rounds to 4 decimals: a small ratio (0.0294 in a CI-like run) is within 5e-5, not 0.1%
            assert r["ratio"] == pytest.approx(r["calls_per_s"] / raw["calls_per_s"], rel=1e-3, abs=1e-4)
        assert raw["events_per_run"] == 24 and raw["cpu_us_per_call"] > 0 and raw["calls_per_s"] > 0
    assert st["raw_delivery_errors"] == 0
    assert doc["steps_ratio"] == st["steps_ratio"] == st["points"][-1]["asyncio"]["ratio"]
    assert doc["steps_calls_per_s"] == st["points"][-1]["asyncio"]["calls_per_s"]


def _check_exit(code: int, doc: dict[str, Any]) -> None:
    """The exit status says whether every reported target was met: 0 all met, 1 some missed (which
    a tiny run on a busy machine may well do), nothing else."""
    missed = sorted(k for k, t in doc["targets"].items() if not t["met"])
    assert code == (1 if missed else 0), (code, missed)


@pytest.mark.integration
@pytest.mark.slow
def test_bench_tiny_prints_every_figure(settings: Settings, redis_client: redis.Redis, tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str],
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", settings.kafka_bootstrap_servers)
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    plot = tmp_path / "bench.png"
    code = main(["bench", "--size", "tiny", "--json", "--quiet", "--plot", str(plot)])
    said = capsys.readouterr()
    assert said.out.strip(), f"no JSON (exit {code}): {said.err[-3000:]}"  # what the bench said instead
    doc = json.loads(said.out)
    _check_exit(code, doc)
    for k in KEYS:
        assert isinstance(doc[k], int | float), k
        assert doc["targets"][k]["value"] == doc[k]
    assert doc["append"]["runlog_events_per_s"] > 0 and doc["append"]["raw_events_per_s"] > 0
    assert doc["intent_latency"]["runlog_p99_ms"] >= doc["intent_latency"]["runlog_p50_ms"] > 0
    assert doc["projector"]["runlog_events_per_s"] > 0 and doc["projector"]["raw_events_per_s"] > 0
    assert doc["projector"]["faust_stream_events_per_s"] > 0
    assert doc["projector"]["projector_of_faust_stream"] == pytest.approx(
        doc["projector"]["runlog_events_per_s"] / doc["projector"]["faust_stream_events_per_s"], rel=1e-3,
        abs=1e-4)
    assert doc["projector"]["faust_batches_events_per_s"] > 0
    assert doc["projector"]["projector_of_faust_batches"] == pytest.approx(
        doc["projector"]["runlog_events_per_s"] / doc["projector"]["faust_batches_events_per_s"], rel=1e-3,
        abs=1e-4)
    assert doc["lag"]["lag_max_ms"] >= doc["lag"]["lag_p99_ms"] >= doc["lag"]["lag_p50_ms"] >= 0
    high = doc["lag_high"]
    assert high["lag_max_ms"] >= high["lag_p99_ms"] >= high["lag_p50_ms"] >= 0
    # the rates asked for (what a loaded machine achieves of them is a measurement, not a promise)
    assert high["target_events_per_s"] > doc["lag"]["target_events_per_s"]
    assert high["offered_events_per_s"] > 0 and doc["lag"]["offered_events_per_s"] > 0
    # the host's speed index, the projector's capacity and the lag at 20% and 50% of it
    assert doc["speed_index"] == doc["speed"]["index"] > 0 and doc["speed_at_end"]["index"] > 0
    assert doc["projector_capacity_per_s"] == doc["projector"]["runlog_events_per_s"] > 0
    for name, share in (("lag_low", 0.2), ("lag_half", 0.5)):
        lp = doc[name]
        assert lp["share_of_capacity"] == share and lp["lag_p99_ms"] >= lp["lag_p50_ms"] >= 0
        assert lp["target_events_per_s"] == max(int(doc["projector_capacity_per_s"] * share), 50)
        assert doc[f"{name}_p50_ms"] == lp["lag_p50_ms"] and doc[f"{name}_p99_ms"] == lp["lag_p99_ms"]
    # parallel replays: both worker counts read every event of the projector's topic
    for kind in ("audit", "rebuild"):
        assert set(doc[f"{kind}_events_per_s"]) == {"1", "2"}
        assert [p["events"] for p in doc["replays"][kind]] == [doc["rebuild"]["events"]] * 2
    ol = doc["steps_open_loop"]
    assert [p["share"] for p in ol["points"]] == pytest.approx([0.1 * k for k in range(1, 10)])
    assert ol["max_runs_per_s"] > 0 and all(p["errors"] == 0 for p in ol["points"])
    assert all(p["plan_ms"] > 0 for p in doc["resume"]["points"])
    assert doc["resumer_group"]["completed"] == doc["resumer_group"]["runs"]
    assert doc["scale"]["writer"]["events_per_s"] > 0
    _check_concurrent(doc)
    _check_steps(doc)
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert os.path.basename(doc["plot"]) == "bench.png"
    # nothing of this bench run is left behind in Redis
    assert not list(redis_client.scan_iter(match=f"bench-{doc['tag']}-*", count=1000))


@pytest.mark.integration
@pytest.mark.slow
def test_bench_only_runs_the_named_sections(settings: Settings, redis_client: redis.Redis,
                                            capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", settings.kafka_bootstrap_servers)
    monkeypatch.setenv("REDIS_URL", settings.redis_url)
    code = main(["bench", "--size", "tiny", "--only", "concurrency", "--json", "--quiet", "--plot", ""])
    doc = json.loads(capsys.readouterr().out)
    _check_exit(code, doc)
    assert doc["sections"] == ["concurrency"]
    assert set(doc["targets"]) == set(CONCURRENCY)
    assert "append" not in doc and "projector" not in doc and "plot" not in doc
    _check_concurrent(doc)
    assert not list(redis_client.scan_iter(match=f"bench-{doc['tag']}-*", count=1000))
    assert main(["bench", "--only", "nosuch", "--quiet"]) == 2
