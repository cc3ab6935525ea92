"""The fleet acceptance of issue #37, scaled down (:mod:`tests.integration.fleet.acceptance`): a
fake provider in its own process allowing 600 requests and 100,000 tokens per minute; 600 runs from
three tenants (1:1:2) submitted by a client and executed by two ``runlog worker`` processes, one
SIGKILLed a third of the way and started again. Every run completes once with its outputs read by
this process; the provider never answers 429; the fleet uses at least 90% of the token limit in
the whole minutes after the first (whose full bucket lets it pass 100%); each tenant's share of
completions while all three are backlogged is within 10% of its weight; each effect is applied
once; a second submit with a key returns its run. The full 1,000-run version is
``python -m tests.integration.fleet.acceptance --runs 1000 --per 60`` (docs/how-to/fleet.md has its
figures)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runlog.schemas import Settings
from tests.integration.fleet.acceptance import check, run_acceptance

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_a_fleet_shares_one_provider_limit_fairly_and_completes_every_run_once(
        topics: Settings, tmp_path: Path) -> None:
    settings = topics.with_(resumer_group=f"{topics.redis_prefix}-acc", lease_ttl_ms=3000,
                            sweep_interval_ms=1000)
    figures = run_acceptance(settings, runs=600, per_s=60.0, workdir=tmp_path, concurrency=8, timeout_s=600)
    print(json.dumps(figures))
    assert check(figures) == [], figures
