"""The bench's pure parts: synthetic histories fold cleanly, statistics, the PNG writer, the target check."""

from __future__ import annotations

import math
import struct
import zlib

from processors.bench import SIZES, Panel, encode_png, line_chart, targets_met
from processors.bench._events import CYCLE, history, median, percentile, ratio
from projections import OutcomeKind, fold
from projections._state import RunStatus
from schemas import Codec, EventType


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


def _chunks(png: bytes) -> list[tuple[bytes, bytes]]:
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    out, i = [], 8
    while i < len(png):
        (n,) = struct.unpack(">I", png[i:i + 4])
        kind, data = png[i + 4:i + 8], png[i + 8:i + 8 + n]
        (crc,) = struct.unpack(">I", png[i + 8 + n:i + 12 + n])
        assert crc == zlib.crc32(kind + data)
        out.append((kind, data))
        i += 12 + n
    return out


def test_png_is_well_formed() -> None:
    png = encode_png(2, 1, [b"\xff\x00\x00\x00\xff\x00"])
    chunks = _chunks(png)
    assert [k for k, _ in chunks] == [b"IHDR", b"IDAT", b"IEND"]
    assert struct.unpack(">II", chunks[0][1][:8]) == (2, 1)
    assert zlib.decompress(chunks[1][1]) == b"\x00\xff\x00\x00\x00\xff\x00"


def test_line_chart_draws_its_series() -> None:
    blank = line_chart([Panel("t", {}, "ms")], width=200, height=120)
    series = {"a": [(20.0, 1.0), (1000.0, 3.0), (100_000.0, 2.0)]}
    drawn = line_chart([Panel("t", series, "ms")], width=200, height=120)
    raw = zlib.decompress(_chunks(drawn)[1][1])
    assert struct.unpack(">II", _chunks(drawn)[0][1][:8]) == (200, 120)
    assert len(raw) == 120 * (1 + 3 * 200)
    assert bytes((31, 119, 180)) in raw  # the first series' colour
    assert bytes((31, 119, 180)) not in zlib.decompress(_chunks(blank)[1][1])


def test_targets_met_reports_the_miss_factor() -> None:
    t = targets_met({"append_ratio": 0.4, "intent_latency_ratio": 1.0, "projector_ratio": 0.6,
                     "lag_p99_ms": 100.0, "resume_tail_ratio": 1.5, "rebuild_ratio": math.nan})
    assert t["append_ratio"]["met"] is False and t["append_ratio"]["missed_by_factor"] == 2.0
    assert t["intent_latency_ratio"]["met"] is True
    assert t["projector_ratio"]["met"] is True
    assert t["lag_p99_ms"]["missed_by_factor"] == 2.0
    assert t["resume_tail_ratio"]["met"] is True
    assert t["rebuild_ratio"]["met"] is False


def test_sizes_grow_from_tiny_to_full() -> None:
    assert SIZES["tiny"].append_events < SIZES["quick"].append_events < SIZES["full"].append_events
    assert SIZES["full"].scale_runs == 10_000
    assert SIZES["full"].projector_marks == (100_000, 1_000_000)
