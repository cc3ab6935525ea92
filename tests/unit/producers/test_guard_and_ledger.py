"""The stage context's determinism guard, recorded sources and effects-ledger decisions (no services:
a session that records appends, the in-memory ledger, the local artifact store)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from runlog.producers import CallInfo, LocalArtifactStore, StageContext, tool
from runlog.producers.base._protocol import IO, io
from runlog.producers.calls._calls import RecordedCall, StageOutputs
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.producers.calls._ledger import InMemoryEffectLedger, LedgerEntry
from runlog.schemas import Diverged, EffectInDoubt, EffectStatus, EventType, ReplayPolicy


class _Lease:
    def verify(self) -> None: ...
    async def averify(self) -> None: ...
    def check(self) -> None: ...


class FakeSession:
    """What StageContext uses of a RunSession: it records every append."""

    def __init__(self, run_id: str = "run-b") -> None:
        self.run_id, self.epoch, self.params = run_id, 2, {}
        self.lease = _Lease()
        self.events: list[tuple[EventType, dict[str, Any]]] = []

    def append(self, type: EventType, **fields: Any) -> Any:
        self.events.append((type, fields))
        return SimpleNamespace(event=SimpleNamespace(seq=len(self.events)))

    async def aappend(self, type: EventType, **fields: Any) -> Any:
        return self.append(type, **fields)

    def appending(self, type: EventType, **fields: Any) -> IO[Any]:
        return io(self.append, self.aappend, type, **fields)

    def check(self) -> None: ...

    def crash_point(self, point: str) -> None: ...

    async def acrash_point(self, point: str) -> None: ...

    def crashing(self, point: str) -> IO[None]:
        return io(self.crash_point, self.acrash_point, point)

    def types(self) -> list[EventType]:
        return [t for t, _ in self.events]


calls: list[tuple[str, dict[str, Any], str | None]] = []


@tool("lookup", policy=ReplayPolicy.SAFE)
def lookup(call: CallInfo, q: str) -> Any:
    calls.append(("lookup", {"q": q}, call.idempotency_key))
    return {"answer": q.upper()}


@tool("charge", policy=ReplayPolicy.NEVER, target="payments",
      delivery=lambda a, c: ("a", "p", a["order"], "1"))
def charge(call: CallInfo, order: str) -> Any:
    calls.append(("charge", {"order": order}, call.idempotency_key))
    return {"external_id": f"ch-{order}"}


@tool("reserve", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="stock",
      delivery=lambda a, c: ("a", "s", a["order"], "1"))
def reserve(call: CallInfo, order: str) -> Any:
    calls.append(("reserve", {"order": order}, call.idempotency_key))
    return {"external_id": f"r-{order}"}


@tool("mail", policy=ReplayPolicy.RECONCILE_FIRST, target="mail",
      delivery=lambda a, c: ("a", "m", a["order"], "1"),
      reconcile=lambda dk, args: {"external_id": "m-found", "how": "reconciled"})
def mail(call: CallInfo, order: str) -> Any:
    calls.append(("mail", {"order": order}, call.idempotency_key))
    return {"external_id": "m-new"}


@pytest.fixture(autouse=True)
def _reset() -> None:
    calls.clear()


def ctx_for(tmp_path: Path, session: FakeSession, recorded: dict[str, RecordedCall] | None = None,
            ledger: InMemoryEffectLedger | None = None) -> StageContext:
    store = LocalArtifactStore(tmp_path)
    return StageContext(session, "s", store, StageOutputs(store, {}),  # type: ignore[arg-type]
                        recorded_calls=recorded or {}, reconciled={}, ledger=ledger)


def _recorded(tmp_path: Path, call_id: str, tool_name: str, args: dict[str, Any],
              result: Any) -> RecordedCall:
    ref = LocalArtifactStore(tmp_path).put(canonical_json(result), "application/json")
    return RecordedCall(call_id, tool_name, sha256_hex(canonical_json(args)), ref)


# -- the guard ---------------------------------------------------------------------------------------


def test_the_same_call_at_a_recorded_position_gets_the_recorded_result(tmp_path: Path) -> None:
    s = FakeSession()
    rec = _recorded(tmp_path, "s/lookup/0", "lookup", {"q": "x"}, {"answer": "recorded"})
    assert ctx_for(tmp_path, s, {rec.call_id: rec}).call(lookup, q="x") == {"answer": "recorded"}
    assert calls == [] and s.events == []


def test_other_arguments_at_a_recorded_position_diverge_and_run_nothing(tmp_path: Path) -> None:
    s = FakeSession()
    rec = _recorded(tmp_path, "s/lookup/0", "lookup", {"q": "x"}, {"answer": "recorded"})
    ctx = ctx_for(tmp_path, s, {rec.call_id: rec})
    with pytest.raises(Diverged, match="diverged") as err:
        ctx.call(lookup, q="y")
    assert calls == []
    assert s.types() == [EventType.CALL_DIVERGED]
    fields = s.events[0][1]
    assert fields["call_id"] == "s/lookup/0"
    assert fields["request_hash"] == sha256_hex(canonical_json({"q": "y"}))
    assert fields["attributes"]["recorded_request_hash"] == rec.request_hash
    assert ctx.failure is err.value  # a stage that swallows it still ends blocked


def test_another_tool_at_a_recorded_position_diverges(tmp_path: Path) -> None:
    s = FakeSession()
    rec = _recorded(tmp_path, "s/lookup/0", "lookup", {"q": "x"}, {"answer": "recorded"})
    with pytest.raises(Diverged):
        ctx_for(tmp_path, s, {rec.call_id: rec}).call(reserve, order="o1")
    assert calls == [] and s.types() == [EventType.CALL_DIVERGED]


def test_a_recorded_call_without_a_usable_result_runs_again_when_it_matches(tmp_path: Path) -> None:
    s = FakeSession()
    rec = RecordedCall("s/lookup/0", "lookup", sha256_hex(canonical_json({"q": "x"})), None)
    assert ctx_for(tmp_path, s, {rec.call_id: rec}).call(lookup, q="x") == {"answer": "X"}
    assert [c[0] for c in calls] == ["lookup"]
    assert s.types() == [EventType.TOOL_CALLED, EventType.TOOL_RESULT]


def test_recorded_sources_are_read_back_on_a_rerun(tmp_path: Path) -> None:
    first = FakeSession()
    ctx = ctx_for(tmp_path, first)
    values = (ctx.random(), ctx.now(), ctx.uuid())
    results = [f for t, f in first.events if t is EventType.TOOL_RESULT]
    recorded = {}
    for (t, f) in first.events:
        if t is EventType.TOOL_CALLED:
            res = next(r for r in results if r["call_id"] == f["call_id"])
            cid = f["call_id"]
            recorded[cid] = RecordedCall(cid, f["tool"], f["request_hash"], res["payload_ref"])
    again = FakeSession()
    ctx2 = ctx_for(tmp_path, again, recorded)
    assert (ctx2.random(), ctx2.now(), ctx2.uuid()) == values
    assert again.events == []


# -- the ledger ---------------------------------------------------------------------------------------


def _ledger_with(delivery: tuple[str, str, str, str], status: EffectStatus, external_id: str | None = None,
                 idem: str | None = None) -> InMemoryEffectLedger:
    from runlog.producers.calls._keys import delivery_key

    led = InMemoryEffectLedger()
    dk = delivery_key(*delivery)
    assert led.open(LedgerEntry(dk, "run-a", "s/x/0", EffectStatus.INTENT, None, idem, "x")) is None
    if status is not EffectStatus.INTENT:
        led.close(dk, "run-a", "s/x/0", status, external_id)
    return led


def test_an_effect_done_in_another_run_is_not_executed(tmp_path: Path) -> None:
    s = FakeSession()
    led = _ledger_with(("a", "p", "o1", "1"), EffectStatus.DONE, "ch-first")
    assert ctx_for(tmp_path, s, ledger=led).call(charge, order="o1") == {"external_id": "ch-first"}
    assert calls == []
    assert s.types() == [EventType.TOOL_CALLED, EventType.EFFECT_RECONCILED, EventType.TOOL_RESULT]
    rec = s.events[1][1]
    assert rec["external_id"] == "ch-first" and rec["attributes"]["from_run"] == "run-a"


def test_a_never_effect_open_in_another_run_blocks(tmp_path: Path) -> None:
    s = FakeSession()
    led = _ledger_with(("a", "p", "o1", "1"), EffectStatus.INTENT)
    with pytest.raises(EffectInDoubt, match="in doubt in run run-a"):
        ctx_for(tmp_path, s, ledger=led).call(charge, order="o1")
    assert calls == [] and EventType.EFFECT_INTENT not in s.types()


def test_an_idempotent_effect_open_elsewhere_is_called_with_the_holders_key(tmp_path: Path) -> None:
    s = FakeSession()
    led = _ledger_with(("a", "s", "o1", "1"), EffectStatus.INTENT, idem="k-of-run-a")
    assert ctx_for(tmp_path, s, ledger=led).call(reserve, order="o1") == {"external_id": "r-o1"}
    assert calls == [("reserve", {"order": "o1"}, "k-of-run-a")]
    intent = next(f for t, f in s.events if t is EventType.EFFECT_INTENT)
    assert intent["idempotency_key"] == "k-of-run-a"


def test_a_reconcile_first_effect_open_elsewhere_asks_the_system_first(tmp_path: Path) -> None:
    s = FakeSession()
    led = _ledger_with(("a", "m", "o1", "1"), EffectStatus.INTENT)
    out = ctx_for(tmp_path, s, ledger=led).call(mail, order="o1")
    assert out["external_id"] == "m-found" and calls == []
    assert EventType.EFFECT_RECONCILED in s.types()
    found = led.lookup(next(f for t, f in s.events if t is EventType.EFFECT_RECONCILED)["delivery_key"])
    assert found is not None and found.done and found.external_id == "m-found"


def test_an_effect_nobody_holds_is_claimed_and_closed_with_its_result(tmp_path: Path) -> None:
    s = FakeSession()
    led = InMemoryEffectLedger()
    ctx_for(tmp_path, s, ledger=led).call(charge, order="o2")
    assert [c[0] for c in calls] == ["charge"]
    dk = next(f for t, f in s.events if t is EventType.EFFECT_INTENT)["delivery_key"]
    got = led.lookup(dk)
    assert got is not None and got.done and (got.run_id, got.external_id) == ("run-b", "ch-o2")
