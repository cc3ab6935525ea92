"""``runlog chaos`` without services: the fault plan and scheduler, the count (a planted duplicate and a
planted lost event are reported), the report's verdict, the CLI's usage errors."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from pathlib import Path

import pytest

from runlog.processors.chaos import (
    KINDS,
    ChaosOptions,
    ChaosResult,
    Count,
    Planned,
    Scheduler,
    plan,
    render,
    verdict,
)
from runlog.processors.chaos.count import lost_events, outcomes, read_acks, world_duplicates, world_effects
from runlog.processors.cli import main
from runlog.processors.demo.world import World
from runlog.projections import RunState, RunStatus
from runlog.schemas import ErrorInfo

# -- the plan and the scheduler -----------------------------------------------------------------


def test_the_plan_draws_every_kind_once_before_any_twice_within_the_duration() -> None:
    p = plan(random.Random(7), 600, gap=(5, 10), start=10)
    assert p and all(10 <= x.at < 600 for x in p)
    assert all(5 <= b.at - a.at <= 10.1 for a, b in itertools.pairwise(p))
    first = [x.kind for x in p[:len(KINDS)]]
    assert sorted(first) == sorted(KINDS)  # one full round before any repeat
    counts = Counter(x.kind for x in p)
    assert max(counts.values()) - min(counts.values()) <= 1
    assert p == plan(random.Random(7), 600, gap=(5, 10), start=10)  # a seed gives the same plan


def test_the_plan_keeps_to_the_kinds_given_and_a_quiet_tail() -> None:
    p = plan(random.Random(1), 100, gap=(1, 2), kinds=("net-reset", "membership"), quiet_tail=30)
    assert {x.kind for x in p} == {"net-reset", "membership"}
    assert all(x.at < 70 for x in p)


def test_the_scheduler_records_what_landed_and_what_did_not() -> None:
    hits: list[str] = []

    def ok(rng: random.Random) -> tuple[str, float]:
        hits.append("ok")
        return "worker-1", 1.5

    def broken(rng: random.Random) -> tuple[str, float]:
        raise LookupError("no worker alive")

    said: list[str] = []
    s = Scheduler([Planned(0, "kill-worker"), Planned(0, "net-reset"), Planned(0, "kill-worker")],
                  {"kill-worker": ok, "net-reset": broken}, random.Random(1), say=said.append)
    s.start()
    s.stop(timeout=10)
    assert hits == ["ok", "ok"]
    assert s.injected_by_kind() == {"kill-worker": 2}
    assert s.failed_by_kind() == {"net-reset": 1}
    assert [f.target for f in s.faults] == ["worker-1", "", "worker-1"]
    assert any("NOT INJECTED: LookupError: no worker alive" in line for line in said)


def test_the_scheduler_refuses_a_plan_with_a_kind_it_cannot_act_out() -> None:
    with pytest.raises(ValueError, match="no action for fault kinds broker-restart"):
        Scheduler([Planned(0, "broker-restart")], {}, random.Random(1))


def test_a_stopped_scheduler_injects_nothing_more() -> None:
    s = Scheduler([Planned(3600, "net-reset")], {"net-reset": lambda rng: ("x", 0.0)}, random.Random(1))
    s.start()
    s.stop(timeout=5)
    assert s.faults == []


# -- the count ----------------------------------------------------------------------------------


def test_a_lost_event_is_an_acknowledged_append_the_log_lacks(tmp_path: Path) -> None:
    acks = tmp_path / "w.acks"
    acks.write_text("run-a 0 0 10\nrun-a 1 0 11\nrun-b 0 1 4\nrun-b 1 1 5\nrun-b 2 1")  # torn: ok
    logged = [("run-a", 0), ("run-a", 1), ("run-b", 0), ("run-c", 0)]
    acked = read_acks([acks])
    assert len(acked) == 5
    assert lost_events(acked, logged) == ["run-b#1", "run-b#2"]
    assert lost_events(acked, [*logged, ("run-b", 1), ("run-b", 2)]) == []


def test_duplicate_effects_are_read_from_the_worlds_own_storage(tmp_path: Path) -> None:
    world = World(tmp_path / "world")
    art = {"title": "t", "content_hash": "h", "body": "b"}
    world.publish(dict(art, delivery_key="k1"))
    world.publish(dict(art, delivery_key="k2"))
    world.charge("acct", 100, "order-1")
    world.upload("up-1", b"x")
    world.upload("up-1", b"x")  # the same key: stored once
    world.render("p", 1, "r-1")
    world.render("p", 1, "r-1")  # the same key: billed once
    none: dict[str, list[str]] = {"publishes": [], "charges": [], "renders": [], "assets": []}
    assert world_duplicates(tmp_path / "world") == none
    world.publish(dict(art, delivery_key="k1"))  # a blind retry: published twice
    world.charge("acct", 100, "order-1")  # charged twice
    dup = world_duplicates(tmp_path / "world")
    assert dup["publishes"] == ["k1 x2"] and dup["charges"] == ["order-1 x2"]
    assert world_effects(tmp_path / "world") == {"publishes": 3, "charges": 2, "renders_billed": 1,
                                                 "assets": 1, "uploads": 2, "research_calls": 0}


def test_every_run_not_completed_gets_its_reason() -> None:
    states = {
        "r1": RunState("r1", status=RunStatus.COMPLETED),
        "r2": RunState("r2", status=RunStatus.FAILED, stage="pay",
                       last_error=ErrorInfo("TerminalToolError", "card declined")),
        "r3": RunState("r3", status=RunStatus.RUNNING, stage="visual"),
    }
    counts, reasons = outcomes(states)
    assert counts == {"COMPLETED": 1, "FAILED": 1, "RUNNING": 1}
    assert set(reasons) == {"r2", "r3"}
    assert reasons["r2"] == "FAILED; TerminalToolError: card declined; at stage pay"
    assert reasons["r3"] == "RUNNING; at stage visual"


# -- the report ---------------------------------------------------------------------------------


def _result(count: Count) -> ChaosResult:
    return ChaosResult(ChaosOptions(duration=60), 5, 70.0, 10, 2, {}, {"kill-worker": 2, "net-partition": 1},
                       {}, count)


def test_the_verdict_names_each_kind_of_damage() -> None:
    clean = Count(runs=3, statuses={"COMPLETED": 3}, effects={"publishes": 3}, acked=30, events=33)
    assert clean.ok and verdict(_result(clean)) == []
    text = render(_result(clean))
    assert "faults injected      3: kill-worker 2, net-partition 1" in text
    assert text.splitlines()[-1].endswith("ok")
    bad = Count(runs=3, statuses={"COMPLETED": 2, "BLOCKED": 1},
                reasons={"r3": "BLOCKED; in doubt: charge k"},
                duplicates={"charges": ["order-1 x2"]}, lost=["r1#4"], projection_differences=["{r2}:state"],
                dead_letters=1)
    assert not bad.ok
    assert verdict(_result(bad)) == ["1 duplicate effects", "1 lost events",
                                     "1 projection differences, 0 runs the live projection never reached",
                                     "1 dead letters"]
    text = render(_result(bad))
    assert "charges: order-1 x2" in text and "r1#4" in text and "{r2}:state" in text
    assert "not completed r3: BLOCKED; in doubt: charge k" in text
    assert "FAILED: 1 duplicate effects" in text.splitlines()[-1]


# -- the CLI ------------------------------------------------------------------------------------


@pytest.mark.parametrize(("args", "says"), [
    (["--gap", "x"], "--gap takes MIN,MAX seconds"),
    (["--kinds", "kill-worker,meteor"], "unknown fault kinds meteor"),
    (["--duration", "0"], "must be positive"),
    (["--gap", "10,5"], "must be positive"),
])
def test_usage_errors_are_one_line_and_exit_2(args: list[str], says: str, capsys: pytest.CaptureFixture[str]
                                              ) -> None:
    assert main(["chaos", *args]) == 2
    err = capsys.readouterr().err
    assert says in err and len(err.strip().splitlines()) == 1
