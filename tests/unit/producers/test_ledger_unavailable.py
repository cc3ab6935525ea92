"""A Redis failover under the effects ledger lets the writer go of the run as a crash would: no
``FAILED`` is appended (a failed run waits for a person; this one is a resumer's), the effect is not
executed, and the run, taken over again once the ledger answers, completes with the effect once.
In memory: a ledger that fails its first claims as a failing Redis would."""

from __future__ import annotations

from typing import Any

import pytest
import redis

from runlog.producers import CallInfo, ReplayPolicy, Workflow, tool
from runlog.producers.calls._ledger import (
    InMemoryEffectLedger,
    LedgerEntry,
    LedgerUnavailable,
    RedisEffectLedger,
)
from runlog.schemas import EventType
from tests.unit.producers._replay import MemoryWorld


class _FailingLedger(InMemoryEffectLedger):
    """Fails ``failures`` claims the way the Redis ledger does when Redis fails under it."""

    def __init__(self, failures: int) -> None:
        super().__init__()
        self.failures = failures

    def open(self, entry: LedgerEntry) -> LedgerEntry | None:
        if self.failures:
            self.failures -= 1
            with RedisEffectLedger._failing("opening", entry.delivery_key):
                raise redis.ConnectionError("connection reset during a failover")
        return super().open(entry)


def test_a_ledger_failing_under_an_effect_abandons_the_run_without_failing_it() -> None:
    world = MemoryWorld()
    world.ledger = _FailingLedger(1)
    world.runner.ledger = world.ledger
    made: list[str] = []

    @tool("ship", policy=ReplayPolicy.NEVER, effect=True, target="post:parcels",
          delivery=lambda a, c: ("acct", "post", a["order"], "1"))
    def ship(call: CallInfo, order: str) -> dict[str, Any]:
        made.append(order)
        return {"external_id": f"parcel-{order}"}

    wf = Workflow("shipping", "1")

    @wf.stage("send")
    def send(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"parcel": ctx.call(ship, order="o-7")["external_id"]}

    h = world.runner.start_run(wf, {})
    assert h.session is not None
    with pytest.raises(LedgerUnavailable, match="effects ledger: opening"):
        world.runner.execute(h.session, release=False)
    types = [e.type for e in world.events(h.run_id)]
    assert EventType.FAILED not in types and EventType.EFFECT_INTENT not in types, types
    assert made == []
    h.session.lease.release()  # as its ttl would: the writer let go
    res = world.again(h.run_id, wf, {})  # a resumer, once the ledger answers again
    assert res.completed and res.outputs["send"] == {"parcel": "parcel-o-7"}
    assert made == ["o-7"]
