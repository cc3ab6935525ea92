"""The bench's encryption section: the same appends and durable calls with encryption off and on, side by
side; the encrypted side's events really carry envelopes and the clear side's do not."""

from __future__ import annotations

import dataclasses
import math

import pytest

from runlog.processors.bench import SIZES
from runlog.processors.bench._encryption import bench_encryption
from runlog.processors.bench._env import BenchEnv
from runlog.processors.bench.harness import steps_of
from runlog.producers.internal import SealedArtifactStore
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, EventType, RunEvent
from runlog.schemas.settings import Settings


def _tool_results(settings: Settings) -> list[RunEvent]:
    codec = Codec.from_settings(settings)
    return [ev for batch in read_topic(settings) for m in batch
            if (ev := codec.decode(m.value(), RunEvent)).type is EventType.TOOL_RESULT]


@pytest.mark.integration
@pytest.mark.slow  # two namespaces, two writers, two AsyncRunners (about a minute on a loaded machine)
def test_encryption_section_measures_both_sides_and_the_sealed_side_seals(settings: Settings) -> None:
    env = BenchEnv(settings)
    try:
        ticks: list[str] = []
        res = bench_encryption(env, events=400, runs=20, rounds=1, append_rounds=2, steps_runs=10,
                               tick=ticks.append)
        size = dataclasses.replace(SIZES["tiny"], encryption_rounds=1, encryption_append_rounds=2)
        assert len(ticks) == steps_of(size, ("encryption",)) - 1  # the progress bar's count: a warm-up
        assert ticks[:2] == ["encryption append off warm-up", "encryption append on warm-up"]  # round a side
        assert len(res["append_rounds"]["on"]) == len(res["append_rounds"]["off"]) == 2  # untimed
        for name in ("append_on_over_off", "steps_on_over_off", "append_cpu_off_over_on",
                     "steps_cpu_off_over_on"):
            assert res[name] > 0 and not math.isnan(res[name]), name
        assert res["append_off_events_per_s"] > 0 and res["append_on_events_per_s"] > 0
        assert res["append_on_over_off"] == pytest.approx(
            res["append_on_events_per_s"] / res["append_off_events_per_s"], rel=1e-3)
        assert res["steps_off_calls_per_s"] > 0 and res["steps_on_calls_per_s"] > 0
        on, off = _tool_results(env.settings("enc-on", topics=False)), \
            _tool_results(env.settings("enc-off", topics=False))
        assert len(on) >= 400 and len(off) >= 400  # the appends, then the durable calls' results
        assert all(e.payload_ref is not None and SealedArtifactStore.sealed_ref(e.payload_ref) for e in on)
        assert not any(e.payload_ref is not None and SealedArtifactStore.sealed_ref(e.payload_ref)
                       for e in off)
    finally:
        env.close()
