"""The single-writer lease against real Redis and the broker: takeover, fencing, release."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
import redis

from runlog.producers import CallInfo, Runner, Workflow, tool
from runlog.producers.log._lease import LeaseHeld, RedisLeaseManager
from runlog.producers.log._session import RunSession
from runlog.schemas import EventType, ReplayPolicy, Settings
from runlog.schemas.errors import LeaseLost
from tests.integration.producers.conftest import SOURCE
from tests.integration.producers.helpers import events_of, read_events

pytestmark = pytest.mark.integration
T = EventType


def _wf() -> Workflow:
    wf = Workflow("w", "1")
    wf.stage("s")(lambda ctx, inputs: {})
    return wf


def test_taken_over_writer_raises_lease_lost_and_its_late_events_carry_a_stale_epoch(
        runner: Runner, topics: Settings) -> None:
    a = runner.start_run(_wf(), {}).session
    assert a is not None and a.epoch == 1
    a.append(T.STAGE_STARTED, stage="s")
    a.flush()

    other = Runner.from_settings(topics, source=SOURCE)
    try:
        b = RunSession.take_over(other.writer, other.leases, a.run_id, last_seq=a.last_seq, workflow=_wf(),
                                 input_versions={}, source=SOURCE, params={}, force=True)
        assert b.epoch == 2
        attempted: list[int] = []
        deadline = time.monotonic() + topics.lease_ttl_ms / 1000
        with pytest.raises(LeaseLost) as info:
            while time.monotonic() < deadline + 1:
                attempted.append(a.append(T.STAGE_STARTED, stage="s").event.epoch)
                time.sleep(0.05)
        assert info.value.epoch == 1 and info.value.run_id == a.run_id
        a.flush()
        b.append(T.RUN_COMPLETED)
        b.close()
    finally:
        other.close()
    # Every event A attempted after the takeover carries epoch 1 < 2: the fold fences it.
    assert set(attempted) <= {1}
    evs = [r.event for r in events_of(read_events(topics), a.run_id)]
    lease_acq = next(e for e in evs if e.type is T.LEASE_ACQUIRED)
    assert lease_acq.epoch == 2 and lease_acq.seq == 3
    assert all(e.epoch < lease_acq.epoch for e in evs if e.type is not T.RUN_COMPLETED
               and e is not lease_acq)
    # and after LeaseLost, A appends nothing more
    with pytest.raises(LeaseLost):
        a.append(T.STAGE_STARTED, stage="s")


def test_effect_is_refused_at_once_after_takeover(runner: Runner, topics: Settings) -> None:
    entered: list[str] = []
    took_over = threading.Event()

    @tool("pub", policy=ReplayPolicy.RECONCILE_FIRST, target="platform:x",
          delivery=lambda a, c: ("a", "p", "o", "1"), reconcile=lambda k, a: None)
    def pub(call: CallInfo) -> dict[str, Any]:
        entered.append(call.call_id)
        return {"external_id": "x"}

    wf = Workflow("fx", "1")

    @wf.stage("s")
    def s(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        took_over.wait(10)
        return dict(ctx.call(pub))

    h = runner.start_run(wf, {})
    assert h.session is not None
    leases = RedisLeaseManager(redis.Redis.from_url(topics.redis_url), topics, holder="thief")
    errors: list[BaseException] = []

    def run() -> None:
        try:
            assert h.session is not None
            runner.execute(h.session)
        except LeaseLost as err:
            errors.append(err)

    t = threading.Thread(target=run)
    t.start()
    stolen = leases.acquire(h.run_id, force=True)  # another writer takes it; no heartbeat ran since
    took_over.set()
    t.join(20)
    stolen.release()
    leases.close()
    assert len(errors) == 1 and entered == []
    types = [r.event.type for r in events_of(read_events(topics), h.run_id)]
    # the lease is verified (a round trip) before every tool call: nothing of the call is appended
    assert T.EFFECT_INTENT not in types and T.TOOL_CALLED not in types


def test_lease_is_exclusive_kept_alive_and_released(runner: Runner, topics: Settings,
                                                    redis_client: redis.Redis) -> None:
    h = runner.start_run(_wf(), {})
    assert h.session is not None
    key = f"{topics.redis_prefix}:{{{h.run_id}}}:lease"
    assert redis_client.get(f"{topics.redis_prefix}:{{{h.run_id}}}:epoch") == b"1"
    assert redis_client.get(key) == f"{runner.writer.writer_id}|1".encode()
    other = RedisLeaseManager(redis_client, topics, holder="other")
    with pytest.raises(LeaseHeld):
        other.acquire(h.run_id)
    time.sleep(topics.lease_ttl_ms / 1000 * 1.5)  # longer than the ttl: the heartbeat keeps it
    h.session.check()
    assert redis_client.pttl(key) > 0
    runner.execute(h.session)
    assert redis_client.get(key) is None  # released on a clean finish
    lease = other.acquire(h.run_id)
    assert lease.epoch == 2
    lease.release()
    other.close()
