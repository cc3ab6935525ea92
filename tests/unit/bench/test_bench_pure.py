"""The bench's pure parts: synthetic histories fold cleanly, statistics, the target check, the topic
specs, the plot, the conversation section's figures."""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.bench import SIZES, PlotUnavailable, plot_result, targets_met
from runlog.processors.bench._env import raw_topic_spec, replication_mismatch
from runlog.processors.bench._events import CYCLE, history, median, percentile, ratio
from runlog.processors.bench.harness import SECTIONS, steps_of
from runlog.processors.cli import main
from runlog.projections import OutcomeKind, fold
from runlog.projections._state import RunStatus
from runlog.schemas import Codec, ConfigError, EventType, Settings, Topics
from tests.conftest import require_module


def test_history_is_a_valid_run_with_a_checkpoint_every_cycle() -> None:
    state = None
    checkpoints = []
    for i, ev in enumerate(history("run-x", 1, 3 * CYCLE + 1)):
        state, out = fold(state, ev, (0, i))
        assert out.kind is OutcomeKind.ACCEPTED, (ev.seq, out)
        if out.checkpoint is not None:
            checkpoints.append(out.checkpoint.last_seq)
    assert state is not None and state.status is RunStatus.RUNNING
    assert checkpoints == [1 + CYCLE, 1 + 2 * CYCLE, 1 + 3 * CYCLE]
    assert state.calls == {}  # the verified stage's calls are dropped: state stays bounded


def test_history_can_start_mid_run() -> None:
    evs = list(history("run-x", 150, 160))
    assert [e.seq for e in evs] == list(range(150, 161))


def test_tool_events_are_about_400_bytes_of_avro() -> None:
    codec = Codec()
    sizes = [len(codec.encode(e)) for e in history("run-" + "a" * 32, 1, 200)
             if e.type in (EventType.TOOL_CALLED, EventType.TOOL_RESULT)]
    assert 350 <= sum(sizes) / len(sizes) <= 450


def test_statistics() -> None:
    xs = [float(x) for x in range(1, 101)]
    assert percentile(xs, 50) == 50.0
    assert percentile(xs, 99) == 99.0
    assert percentile(xs, 100) == 100.0
    assert median([3.0, 1.0, 2.0]) == 2.0
    assert math.isnan(percentile([], 50))
    assert ratio(1.0, 4.0) == 0.25
    assert math.isnan(ratio(1.0, 0.0))


def test_targets_met_reports_the_miss_factor() -> None:
    t = targets_met({"append_ratio": 0.4, "intent_latency_ratio": 1.0, "projector_ratio": 0.8,
                     "lag_p99_ms": 100.0, "resume_tail_ratio": 1.5, "rebuild_ratio": math.nan})
    assert t["append_ratio"]["met"] is False and t["append_ratio"]["missed_by_factor"] == 2.0
    assert t["intent_latency_ratio"]["met"] is True
    assert t["projector_ratio"]["met"] is True
    assert t["lag_p99_ms"]["missed_by_factor"] == 2.0
    assert t["resume_tail_ratio"]["met"] is True
    assert t["rebuild_ratio"]["met"] is False


def test_the_lag_section_has_a_point_at_10000_events_per_second_with_its_own_target() -> None:
    assert SECTIONS["lag"] == ("lag_p99_ms", "lag_high_p99_ms", "lag_low_p50_ms", "lag_low_p99_ms",
                               "lag_half_p99_ms")
    assert (SIZES["quick"].lag_rate, SIZES["quick"].lag_rate_high) == (2_000, 10_000)
    t = targets_met({"lag_p99_ms": 40.0, "lag_high_p99_ms": 250.0}, SECTIONS["lag"])
    assert t["lag_p99_ms"]["met"] is True and t["lag_high_p99_ms"]["target"] == "<= 100"
    assert t["lag_high_p99_ms"]["met"] is False and t["lag_high_p99_ms"]["missed_by_factor"] == 2.5
    # at 20% and 50% of capacity, 2,000/s and 10,000/s; the capacity measured when the projector
    # section is left out
    assert steps_of(SIZES["quick"], ("lag",)) == 4 + 2 + 1
    assert steps_of(SIZES["quick"], ("projector", "lag")) == steps_of(SIZES["quick"], ("projector",)) + 4
    t = targets_met({"lag_low_p50_ms": 12.0, "lag_low_p99_ms": 30.0, "lag_half_p99_ms": 49.0},
                    SECTIONS["lag"])
    assert not t["lag_low_p50_ms"]["met"] and t["lag_low_p99_ms"]["met"] and t["lag_half_p99_ms"]["met"]


def test_sizes_grow_from_tiny_to_full() -> None:
    assert SIZES["tiny"].append_events < SIZES["quick"].append_events < SIZES["full"].append_events
    assert SIZES["full"].scale_runs == 10_000
    assert SIZES["full"].projector_marks == (100_000, 1_000_000)


def test_raw_baseline_topic_is_replicated_like_the_events_topic() -> None:
    s = Settings(kafka_bootstrap_servers="unused:1", redis_url="redis://unused:1/0",
                 topic_prefix="bench-t-a.", replication_factor=3, min_insync_replicas=2, partitions=6)
    spec = raw_topic_spec(s, "raw.events")
    events = next(t for t in Topics.of(s).specs(s) if t.name == Topics.of(s).events)
    assert spec.name == "bench-t-a.raw.events"
    assert (spec.partitions, spec.replication_factor) == (6, 3)
    assert spec.config["min.insync.replicas"] == "2"
    assert dict(spec.config) == dict(events.config)


def _info(rf: int, isr: int, broker_rf: int | None, broker_isr: int | None) -> dict[str, object]:
    return {"bootstrap_servers": "b:1", "brokers": 3, "replication_factor": rf, "min_insync_replicas": isr,
            "broker_default_replication_factor": broker_rf, "broker_min_insync_replicas": broker_isr}


def test_a_bench_weaker_than_the_brokers_defaults_is_refused() -> None:
    msg = replication_mismatch(_info(1, 1, 3, 2))
    assert msg is not None and "RUNLOG_REPLICATION_FACTOR=3 RUNLOG_MIN_INSYNC_REPLICAS=2" in msg
    assert replication_mismatch(_info(3, 1, 3, 2)) is not None  # min.insync.replicas weaker
    assert replication_mismatch(_info(3, 2, 3, 2)) is None
    assert replication_mismatch(_info(1, 1, 1, 1)) is None  # the single broker
    assert replication_mismatch(_info(1, 1, None, None)) is None  # broker configs not describable


RESULT = {
    "size": "tiny",
    "machine": {"cpus": 2, "python": "3.11.7"},
    "resume": {"points": [
        {"events": 20, "rebuild_events_per_s": 900.0, "plan_ms": 8.1, "resume_ms": 30.0},
        {"events": 1_000, "rebuild_events_per_s": 9_000.0, "plan_ms": 8.4, "resume_ms": 33.5},
        {"events": 100_020, "rebuild_events_per_s": 14_000.0, "plan_ms": 8.9, "resume_ms": 36.0},
    ]},
}


def test_plot_is_a_png_of_both_panels(tmp_path: Path) -> None:
    require_module("matplotlib", "matplotlib (the test extra) is needed to plot")
    path = tmp_path / "sub" / "bench.png"
    assert plot_result(RESULT, str(path)) == str(path)
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    width, height = struct.unpack(">II", data[16:24])  # IHDR
    assert (width, height) == (1210, 462)  # 11 x 4.2 inches at 110 dpi
    assert len(data) > 30_000  # titles, labels, legends and three lines, not an empty frame


def _without_matplotlib(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(sys.modules):
        if name == "matplotlib" or name.startswith("matplotlib."):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib -> ImportError


def test_plot_without_the_extra_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    _without_matplotlib(monkeypatch)
    with pytest.raises(PlotUnavailable, match=r"runlog\[plot\]"):
        plot_result(RESULT, str(tmp_path / "x.png"))
    # the CLI says so in one line before measuring anything (no broker is reachable here)
    monkeypatch.setenv("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9")
    assert main(["bench", "--size", "tiny", "--only", "resume", "--quiet",
                 "--plot", str(tmp_path / "x.png")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "pip install 'runlog[plot]'" in err and "Traceback" not in err
    assert not (tmp_path / "x.png").exists()


def test_raw_baselines_read_the_avro_body_of_either_framing() -> None:
    from runlog.processors.bench._write import avro_body

    ev = next(history("run-x", 1, 1))
    single = Codec().encode(ev)
    body = single[10:]
    registry = b"\x00" + (7).to_bytes(4, "big") + body  # the Schema Registry wire format, schema id 7
    assert avro_body(single) == avro_body(registry) == body


def test_the_default_plot_is_skipped_without_the_extra(monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from runlog.processors.cli.bench import DEFAULT_PLOT, _plot_path

    assert _plot_path("", ["resume"]) is None
    assert _plot_path("p.png", ["append"]) == "p.png"
    assert _plot_path(None, ["append"]) is None  # nothing to plot: no note either
    require_module("matplotlib", "matplotlib (the test extra) is needed to plot")
    assert _plot_path(None, ["append", "resume"]) == DEFAULT_PLOT
    assert capsys.readouterr().err == ""
    _without_matplotlib(monkeypatch)
    assert _plot_path(None, ["append", "resume"]) is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "runlog[plot]" in err


def test_the_conversation_figures_tell_linear_from_quadratic_growth() -> None:
    from runlog.processors.bench._conversation import conversation_figures

    def points(cost: Callable[[int], float]) -> list[dict[str, Any]]:
        return [{"model_calls": n, "total_bytes": cost(n)} for n in (50, 25, 12)]  # any order

    linear = conversation_figures(points(lambda n: 230_000 + 6_000 * n))
    assert linear["conversation_kb_per_call"] == pytest.approx(6.0)
    assert linear["conversation_growth_ratio"] == pytest.approx(1.0)
    assert linear["conversation_mb_200"] == pytest.approx(1.43)  # 50 calls measured, 150 more at 6 kB
    # every request holding the conversation so far (200 kB of context, 3 kB more per turn)
    whole = conversation_figures(points(lambda n: sum(200_000 + 3_000 * k for k in range(n))))
    assert whole["conversation_growth_ratio"] > 1.1 and whole["conversation_mb_200"] > 5
    assert not targets_met(whole, SECTIONS["conversation"])["conversation_mb_200"]["met"]
    assert all(t["met"] for t in targets_met(linear, SECTIONS["conversation"]).values())


def test_the_conversation_section_sizes_and_steps() -> None:
    assert (SIZES["tiny"].conversation_calls, SIZES["quick"].conversation_calls,
            SIZES["full"].conversation_calls) == (20, 50, 200)
    assert steps_of(SIZES["quick"], ("conversation",)) == 3 + 1
    assert steps_of(SIZES["quick"], ("encryption",)) == 2 * (11 + 5) + 2 + 1  # a warm-up round a side
    assert steps_of(SIZES["tiny"], ("encryption",)) == 2 * (1 + 1) + 1  # one round a side: no warm-up


def test_the_steps_section_sizes_targets_and_progress() -> None:
    assert [SIZES[n].steps_runs for n in ("tiny", "quick", "full")] == [(50,), (100, 1_000),
                                                                       (100, 1_000, 10_000)]
    assert SECTIONS["steps"] == ("steps_ratio", "steps_calls_per_s", "steps_open_p99_over_idle_at_70_ms")
    # async, raw and threads per point; the open loop's idle runs, maximum and nine shares
    assert steps_of(SIZES["full"], ("steps",)) == 3 * 3 + 2 + 9 + 1
    slow = targets_met({"steps_ratio": 0.12, "steps_calls_per_s": 377.0,
                        "steps_open_p99_over_idle_at_70_ms": 25.0}, SECTIONS["steps"])
    assert not slow["steps_ratio"]["met"] and not slow["steps_open_p99_over_idle_at_70_ms"]["met"]
    assert slow["steps_ratio"]["missed_by_factor"] == pytest.approx(0.7 / 0.12)
    assert all(t["met"] for t in targets_met({"steps_ratio": 0.7, "steps_calls_per_s": 2000.0,
                                              "steps_open_p99_over_idle_at_70_ms": 9.0},
                                             SECTIONS["steps"]).values())


def test_the_conversation_section_without_pydantic_ai_names_the_extra(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from runlog.processors.bench import run_bench
    from runlog.processors.bench._conversation import unavailable

    assert unavailable() is None
    monkeypatch.setitem(sys.modules, "pydantic_ai", None)  # import pydantic_ai -> ImportError
    assert "runlog[pydantic-ai]" in (unavailable() or "")
    s = Settings(kafka_bootstrap_servers="127.0.0.1:9", redis_url="redis://127.0.0.1:9/0")
    with pytest.raises(ConfigError, match=r"runlog\[pydantic-ai\]"):  # refused before any broker is asked
        run_bench(s, "tiny", progress=None, only="conversation")


def test_the_encryption_benchs_payload_compresses_like_prose_not_like_a_repeated_phrase() -> None:
    """The clear side's refs must not compress far better than real payloads do: a payload whose base64
    repeats (the old ``"lorem ipsum " * 14``) let the clear side send a twenty-fifth of the bytes."""
    import base64
    import json
    import zlib

    from runlog.processors.bench._encryption import _payload

    def shrink(refs: list[bytes]) -> float:
        joined = b"".join(refs)
        return len(joined) / len(zlib.compress(joined))

    refs = [base64.b64encode(_payload(run, 3)) for run in range(100)]
    assert len(set(refs)) == 100 and all(150 <= len(_payload(run, 3)) <= 350 for run in range(100))
    assert 1.5 <= shrink(refs) <= 3.5  # zlib on base64 of English text: about 2.5
    phrase = [base64.b64encode(json.dumps({"run": run, "seq": 3, "answer": "lorem ipsum " * 14}).encode())
              for run in range(100)]
    assert shrink(phrase) > 10  # the check tells the two apart
    assert _payload(7, 9) == _payload(7, 9)  # the same bytes in every run of the bench
