"""The open-loop scheduler (arrivals fixed in advance, latency from the scheduled time) and the host
speed index (a fixed calibration that two calls agree on)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from runlog.processors.bench._openloop import open_loop, schedule
from runlog.processors.bench._speed import REPEATS, calibrate, speed_index


def test_a_schedule_is_evenly_spaced_at_the_offered_rate() -> None:
    times = schedule(200.0, 0.05, start=10.0)
    assert len(times) == 10
    assert times[0] == 10.0
    assert all(b - a == pytest.approx(0.005) for a, b in itertools.pairwise(times))
    assert times[-1] < 10.05
    with pytest.raises(ValueError):
        schedule(0.0, 1.0, start=0.0)


class FakeClock:
    """Time that moves only when the loop sleeps, or when a job says it took time."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    async def sleep(self, s: float) -> None:
        self.now += s
        await asyncio.sleep(0)


def test_jobs_start_at_their_scheduled_times_without_waiting_for_earlier_ones() -> None:
    clock = FakeClock()
    started: list[tuple[int, float]] = []
    release = asyncio.Event

    async def main() -> dict[str, object]:
        gate = release()

        async def job(i: int) -> None:
            started.append((i, clock()))
            if i == 0:
                await gate.wait()  # the first job is still under way when the others are due
                clock.now += 0.001
            if i == 3:
                gate.set()

        return await open_loop(schedule(100.0, 0.04, start=1.0), job, clock=clock, sleep=clock.sleep)

    res = asyncio.run(main())
    assert [i for i, _ in started] == [0, 1, 2, 3]
    assert [t for _, t in started] == pytest.approx([1.0, 1.01, 1.02, 1.03])  # open loop: on schedule
    lat = res["latencies_s"]
    assert isinstance(lat, list) and len(lat) == 4
    # job 0 ended after job 3 started (at 1.03) and 1 ms more: its latency counts from 1.00
    assert lat[0] == pytest.approx(0.031)
    assert lat[1:] == pytest.approx([0.0, 0.0, 0.0])


def test_a_late_start_counts_against_the_latency() -> None:
    clock = FakeClock()

    async def main() -> dict[str, object]:
        async def job(i: int) -> None:
            if i == 0:
                clock.now += 0.05  # a stall holding the loop: the next arrivals start late

        return await open_loop(schedule(100.0, 0.03, start=0.0), job, clock=clock, sleep=clock.sleep)

    res = asyncio.run(main())
    # job 0 started at 0.0 and held the loop 50 ms; jobs 1 and 2, due at 10 and 20 ms, started at 50 ms
    # and ended at once: their latencies count from when they were due, not from when they started
    assert res["latencies_s"] == pytest.approx([0.05, 0.04, 0.03])
    assert res["start_late_s"] == pytest.approx([0.0, 0.04, 0.03])


def test_errors_are_counted_not_timed() -> None:
    clock = FakeClock()

    async def job(i: int) -> None:
        if i == 1:
            raise RuntimeError("tool failed")

    res = asyncio.run(open_loop(schedule(10.0, 0.3, start=0.0), job, clock=clock, sleep=clock.sleep))
    assert len(res["latencies_s"]) == 2 and res["errors"] == ["RuntimeError: tool failed"]


def test_the_speed_index_agrees_with_itself() -> None:
    a = speed_index()  # the bench's own calibration (about half a second of CPU)
    assert a["index"] > 0 and a["best_ms"] <= a["median_ms"] and a["repeats"] == REPEATS
    # two calibrations taken side by side (their repeats interleaved, so both meet the same host) agree
    # within 25%: the fastest repeat, timed by the thread's CPU clock, is what the index rests on. Taken
    # one after the other they differed by 39% in the serial phase on this 2-core host, where a sibling
    # hyperthread's load slows even CPU time.
    firsts, seconds = [], []
    for _ in range(REPEATS):
        firsts += calibrate(repeats=1)
        seconds += calibrate(repeats=1)
    assert abs(min(firsts) - min(seconds)) / max(min(firsts), min(seconds)) < 0.25, (firsts, seconds)
    assert len(calibrate(loop=10, repeats=3)) == 3
