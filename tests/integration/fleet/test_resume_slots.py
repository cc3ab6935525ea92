"""A run of a queue that waited durably takes a slot of its queue again when it is resumed, on the
real broker and Redis: with a queue of concurrency 1, a run that slept gave its slot to the next
submission, and its wake-up waits (outcome ``queued``) until that run has finished, so the queue
never executes two runs at once."""

from __future__ import annotations

import time

import pytest
import redis

from runlog.processors.fleet import Client
from runlog.processors.fleet._queues import RedisQueues
from runlog.schemas import Settings
from tests.integration.fleet import _app
from tests.integration.fleet._members import _Member

pytestmark = pytest.mark.integration


def test_a_resumed_run_takes_a_slot_of_its_queue(fleet_settings: Settings, members: list[_Member],
                                                  redis_client: redis.Redis) -> None:
    _app.GAUGE.reset()
    with Client(fleet_settings) as client:
        sleeper = client.submit("napper", {"nap_s": 3, "hold_s": 0.5, "tenant": "a"}, queue="solo",
                                tenant="a")
        time.sleep(0.2)  # the sleeper is the earlier submission: dispatched first
        holder = client.submit("napper", {"nap_s": 0, "hold_s": 6, "tenant": "b"}, queue="solo", tenant="b")
        members.append(_Member(fleet_settings, _app.app_solo, concurrency=2))
        first = holder.result(timeout=60)
        done = time.monotonic()
        second = sleeper.result(timeout=60)
        after = time.monotonic() - done
    assert first.completed and second.completed
    assert _app.GAUGE.most_total == 1  # never two runs of the queue executing at once

    def sleeper_outcomes() -> list[str]:
        return [o.result for m in members for o in m.resumed if o.run_id == sleeper.run_id]

    # the client reads RUN_COMPLETED from the log as soon as it is appended; the member reports the
    # resume's outcome after that (it settles the run first): wait for the report, not only the log
    deadline = time.monotonic() + 30
    while "completed" not in sleeper_outcomes() and time.monotonic() < deadline:
        time.sleep(0.1)
    outcomes = sleeper_outcomes()
    assert "queued" in outcomes, outcomes  # woken while the holder ran: no slot, asked again
    assert outcomes[-1] == "completed", outcomes
    assert after < 10, after
    queues = RedisQueues(redis_client, fleet_settings.redis_prefix, members[0].worker.service.group)
    assert queues.stats("solo").running == {}  # every slot given back
    assert not [m.errors for m in members if m.errors]

