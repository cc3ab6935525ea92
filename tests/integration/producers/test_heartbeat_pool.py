"""The Runner's lease heartbeat has connections of its own: run threads holding every pooled
connection (a busy process) do not make leases age out."""

from __future__ import annotations

import time

import pytest

from runlog.producers import Runner
from runlog.schemas import Settings

pytestmark = pytest.mark.integration

TTL_MS = 600


def test_leases_are_kept_while_the_run_threads_hold_every_connection(settings: Settings) -> None:
    runner = Runner.from_settings(settings.with_(lease_ttl_ms=TTL_MS))
    try:
        lease = runner.leases.acquire("run-busy")
        pool = runner.leases.client.connection_pool  # the pool the runs share
        held = []
        try:
            for _ in range(pool.max_connections):  # every connection the runs could use
                held.append(pool.get_connection())
            time.sleep(TTL_MS / 1000 * 4)  # four ttls: only the heartbeat keeps the lease
            lease.check()  # raises LeaseLost when no heartbeat succeeded within ttl - margin
        finally:
            for c in held:
                pool.release(c)
        lease.verify()
        lease.release()
    finally:
        runner.close()
