"""A few minutes of ``runlog chaos``: the mixed workload on private services under faults of every kind,
then the count. Fails when a fault kind could not be injected, when the count finds a duplicate effect,
a lost event, a projection difference or a dead letter, or when a run did not end."""

from __future__ import annotations

from pathlib import Path

import pytest

from runlog.processors.chaos import KINDS, ChaosOptions, render, run_chaos, verdict
from tests.conftest import require
from tests.faults._network import toxiproxy_binary

pytestmark = [pytest.mark.integration, pytest.mark.slow]

CATEGORIES = {
    "process": {"kill-worker", "stop-worker", "kill-resumer", "stop-resumer", "kill-projector",
                "stop-projector"},
    "infrastructure": {"broker-restart", "redis-restart"},
    "membership": {"membership"},
    "network": {"net-latency", "net-reset", "net-partition"},
}


def test_a_few_minutes_of_chaos_lose_nothing_and_do_nothing_twice(tmp_path: Path) -> None:
    assert set().union(*CATEGORIES.values()) == set(KINDS)
    binary, why = toxiproxy_binary()  # built into .runlog/bin on a new checkout (the chaos run starts it)
    require(binary is not None, f"no toxiproxy-server: deploy/local/toxiproxy build failed: {why}")
    lines: list[str] = []
    result = run_chaos(ChaosOptions(duration=150, workdir=tmp_path / "chaos", seed=20261206, in_flight=2,
                                    gap=(3.0, 6.0), settle=180), lines.append)
    text = render(result)
    print("\n".join(lines) + "\n" + text)
    injected = {k for k, n in result.faults.items() if n}
    assert len(injected) >= 8, f"faults of only {len(injected)} kinds landed: {result.faults}\n{text}"
    for name, kinds in CATEGORIES.items():
        assert injected & kinds, f"no {name} fault landed: {result.faults}\n{text}"
    c = result.count
    assert c.runs >= 5 and c.acked > 50 and c.effects["publishes"] > 0, text
    assert verdict(result) == [], text
    assert c.duplicate_count == 0 and not c.lost and not c.projection_differences and c.dead_letters == 0
    # every run ended: completed, or blocked/failed with the reason the report names
    ended = ("BLOCKED", "FAILED", "CANCELLED")
    unended = {r: why for r, why in c.reasons.items() if not why.startswith(ended)}
    assert not unended, text
    assert c.statuses.get("COMPLETED", 0) >= c.runs // 2, text
