"""How big a bench run is: ``quick`` (about a minute or two) and ``full`` (the published figures)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SIZES", "BenchSize"]


@dataclass(frozen=True, kw_only=True)
class BenchSize:
    name: str
    rounds: int = 3
    append_events: int = 20_000
    append_runs: int = 200
    intent_samples: int = 100
    projector_events: int = 20_000
    projector_runs: int = 200
    projector_rounds: int = 2
    projector_marks: tuple[int, ...] = (5_000, 20_000)
    lag_seconds: float = 6.0
    lag_rate: int = 2_000
    lag_rate_high: int = 10_000
    """The lag section's second point: events/s offered (goal: p99 <= 100 ms, one projector)."""
    lag_runs: int = 50
    resume_lengths: tuple[int, ...] = (20, 1_000, 10_000)
    resume_rounds: int = 15
    """Resume plans timed per history length (the median is reported)."""
    crashed_runs: int = 20
    resumer_members: int = 2
    scale_runs: int = 2_000
    scale_events_per_run: int = 5
    group_sizes: tuple[int, ...] = (1, 2, 4)
    async_runs: int = 2_000
    """Concurrent runs on one AsyncRunner (one loop) in the concurrency section."""
    threaded_runs: int = 200
    """Concurrent runs on the sync Runner, one thread each."""
    concurrency_raw_samples: int = 200
    """Raw produce + flush samples, the confirmed-intent baseline of each side."""
    concurrency_warmup: int = 50
    """Runs made one at a time (no tool latency) before the concurrent ones: the idle intent latency."""
    conversation_calls: int = 50
    steps_runs: tuple[int, ...] = (100, 1_000)
    """Concurrent runs of the steps section's points (eight durable calls each)."""
    open_loop_seconds: float = 3.0
    """Seconds of offered load per point of the steps section's open-loop curve."""
    streams_runs: int = 100
    """Streaming runs (a subscriber each) of the streams section."""
    streams_rate: int = 1_000
    """Deltas per second over all of them."""
    streams_seconds: float = 10.0
    fleet_runs: int = 500
    """Runs submitted to one worker in the fleet section ..."""
    fleet_rate: int = 100
    """... at this many per second (offered, open loop)."""
    limiter_samples: int = 2_000
    """Rate-limit takes timed beside raw Redis round trips."""
    encryption_rounds: int = 5
    """Alternating rounds per side of the encryption section's durable calls (wall-clock drift on a shared
    machine) ..."""
    encryption_append_rounds: int = 11
    """... and of its appends (a round of ``append_events`` takes under a second in the quick size: more
    of them make its median steadier on a noisy host)."""
    """Model calls of the longest agent run in the conversation section (runs of a quarter and a half
    of it too)."""


SIZES: dict[str, BenchSize] = {
    "tiny": BenchSize(name="tiny", rounds=1, append_events=2_000, append_runs=20, intent_samples=10,
                      projector_events=1_000, projector_runs=20, projector_rounds=1,
                      projector_marks=(500, 1_000), lag_seconds=1.0, lag_runs=10, resume_lengths=(20, 200),
                      resume_rounds=3, crashed_runs=2, resumer_members=1, scale_runs=50,
                      scale_events_per_run=2,
                      group_sizes=(1,), async_runs=200, threaded_runs=50, concurrency_raw_samples=50,
                      concurrency_warmup=20, conversation_calls=20, steps_runs=(50,), open_loop_seconds=0.5,
                      streams_runs=10,
                      streams_rate=200, streams_seconds=2.0, fleet_runs=40, fleet_rate=40,
                      limiter_samples=200, encryption_rounds=1,
                      encryption_append_rounds=1),
    "quick": BenchSize(name="quick"),
    "full": BenchSize(name="full", rounds=5, append_events=200_000, append_runs=1_000, intent_samples=500,
                      projector_events=1_000_000, projector_runs=1_000, projector_rounds=2,
                      projector_marks=(100_000, 1_000_000), lag_seconds=30.0, lag_runs=200,
                      resume_lengths=(20, 1_000, 10_000, 100_000), resume_rounds=30, crashed_runs=1_000,
                      resumer_members=4,
                      scale_runs=10_000, scale_events_per_run=10, async_runs=10_000, threaded_runs=1_000,
                      concurrency_raw_samples=500, conversation_calls=200,
                      steps_runs=(100, 1_000, 10_000), open_loop_seconds=10.0, streams_seconds=60.0),
}
