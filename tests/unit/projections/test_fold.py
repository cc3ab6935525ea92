"""The fold, rule by rule: acceptance, duplicates, fencing, the state machine, checkpoints, effects."""

from __future__ import annotations

import ast
from dataclasses import replace
from pathlib import Path

import pytest

from runlog.projections import (
    CallStatus,
    OutcomeKind,
    RunState,
    RunStatus,
    event_digest,
    fold,
    fold_all,
)
from runlog.projections.fold import CHECKPOINT_WINDOW, DIGEST_WINDOW, REJECTED_WINDOW
from runlog.schemas import EffectStatus, ErrorInfo, EventType, RuleResult, StageSpec, WorkflowSpec

from .runlogs import STAGES, WORKFLOW, RunBuilder, art, full_run, zombie

ROOT = Path(__file__).resolve().parents[3]


def positioned(events: list, partition: int = 3, start: int = 100) -> list:
    return [(e, (partition, start + i)) for i, e in enumerate(events)]


def test_pure_modules_import_no_driver() -> None:
    for mod in ("fold.py", "_state.py"):
        tree = ast.parse((ROOT / "projections" / mod).read_text())
        names = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module.split(".")[0])
        assert not names & {"confluent_kafka", "faust", "fastavro", "redis", "mode", "aiokafka"}, mod


def test_run_started_pins_workflow_inputs_and_first_epoch() -> None:
    ev = RunBuilder("r1").start().events[0]
    s, out = fold(None, ev, (4, 7))
    assert out.kind is OutcomeKind.ACCEPTED
    assert s.status is RunStatus.RUNNING
    assert (s.last_seq, s.epoch, s.partition, s.offset) == (1, 1, 4, 7)
    assert s.workflow == WORKFLOW and s.workflow_version == "3"
    assert dict(s.input_versions) == {"facts": "v1", "seed": "7"}
    assert s.next_stage == "research"


def test_full_run_state() -> None:
    events = full_run("r1")
    s = fold_all(positioned(events))
    assert s is not None
    assert s.status is RunStatus.COMPLETED
    assert s.completed_stages == STAGES
    assert s.last_seq == len(events) and s.offset == 100 + len(events) - 1
    assert set(s.stage_outputs) == set(STAGES)
    assert s.stage_outputs["draft"] == art("out-r1-draft")
    assert len(s.verified_artifacts) == len(STAGES)
    assert len(s.checkpoints) == len(STAGES)
    assert s.checkpoint is not None and s.checkpoint.stage == "publish"
    assert s.open_effects == {} and len(s.closed_effects) == 2
    assert all(e.status is EffectStatus.DONE for e in s.closed_effects.values())
    assert s.calls == {}  # every finished call belongs to a verified stage


def test_gap_is_rejected_out_of_order_and_counted() -> None:
    evs = RunBuilder("r").start().stage("research").events
    s = fold_all(evs[:2])
    s2, out = fold(s, evs[3])
    assert out.kind is OutcomeKind.REJECTED_OUT_OF_ORDER and out.reason == "seq_gap"
    assert s2.last_seq == s.last_seq and s2.rejected == {"seq_gap": 1}
    assert s2.recent_rejected[-1].seq == evs[3].seq


def test_first_event_not_seq_one_is_rejected() -> None:
    ev = full_run("r")[4]
    s, out = fold(None, ev)
    assert out.kind is OutcomeKind.REJECTED_OUT_OF_ORDER
    assert s.status is RunStatus.PENDING and s.last_seq == 0 and s.rejected_total == 1


def test_duplicate_same_content_changes_nothing() -> None:
    evs = full_run("r", stages=2)
    s = fold_all(evs)
    assert s is not None
    for ev in (evs[-1], evs[3], evs[0]):
        s2, out = fold(s, ev)
        assert out.kind is OutcomeKind.DUPLICATE and out.reason == "same_content"
        assert s2 is s


def test_same_seq_other_content_is_rejected() -> None:
    evs = full_run("r", stages=1)
    s = fold_all(evs)
    assert s is not None
    forged = replace(evs[2], tool="other")
    s2, out = fold(s, forged)
    assert out.kind is OutcomeKind.REJECTED_OUT_OF_ORDER and out.reason == "seq_replayed"
    assert s2.without_audit() == s.without_audit()


def test_digest_covers_every_field() -> None:
    ev = full_run("r", stages=1)[2]
    assert event_digest(ev) == event_digest(replace(ev))
    assert event_digest(ev) != event_digest(replace(ev, occurred_at=ev.occurred_at + 1))
    assert event_digest(ev) != event_digest(replace(ev, attributes={"x": "1"}))


def test_redelivered_position_is_duplicate_even_for_rejected_events() -> None:
    evs = RunBuilder("r").start().events
    s, _ = fold(None, evs[0], (0, 10))
    bad = replace(evs[0], seq=5)
    s2, out = fold(s, bad, (0, 11))
    assert out.rejected and s2.rejected_total == 1
    s3, out3 = fold(s2, bad, (0, 11))
    assert out3.kind is OutcomeKind.DUPLICATE and out3.reason == "redelivered" and s3 is s2


def test_lease_needs_strictly_higher_epoch_and_fences_the_old_writer() -> None:
    b = RunBuilder("r").start().stage("research")
    s = fold_all(b.events)
    assert s is not None
    same = b.add(EventType.LEASE_ACQUIRED)  # epoch 1 again
    s2, out = fold(s, same)
    assert out.kind is OutcomeKind.REJECTED_FENCED and out.reason == "lease_epoch_not_higher"
    assert s2.epoch == 1 and s2.last_seq == s.last_seq
    b.events.pop()
    b.lease(2)
    s3, out = fold(s, b.events[-1])
    assert out.accepted and s3.epoch == 2
    old = zombie(b.events[-2], epoch=1, seq=s3.last_seq + 1)
    s4, out = fold(s3, old)
    assert out.kind is OutcomeKind.REJECTED_FENCED and out.reason == "stale_epoch"
    assert s4.without_audit() == s3.without_audit() and s4.rejected == {"stale_epoch": 1}
    # the new writer continues; higher epochs without a lease are accepted too (epoch >= so far)
    b.stage("verify")
    s5 = fold_all(b.events[s3.last_seq:], s4)
    assert s5 is not None and s5.last_seq == len(b.events) and s5.completed_stages == ("research", "verify")


def test_checkpoint_manifest_on_verified() -> None:
    b = RunBuilder("r9").start().stage("research").stage("verify")
    items = positioned(b.events, partition=5, start=1000)
    s = None
    cps = []
    for ev, pos in items:
        s, out = fold(s, ev, pos)
        if out.checkpoint:
            cps.append((out.checkpoint, pos))
    assert s is not None and [c.stage for c, _ in cps] == ["research", "verify"]
    cp, pos = cps[-1]
    assert cp.checkpoint_id == f"r9:{cp.last_seq}"
    assert (cp.partition, cp.offset) == pos
    assert cp.last_seq == len(b.events)
    assert cp.next_stage == "draft" and s.next_stage == "draft"
    assert dict(cp.inputs) == {"facts": "v1", "seed": "7"}
    assert [a.uri for a in cp.artifacts] == [art("a-r9-research").uri, art("a-r9-verify").uri]
    assert cp.verified_by == (RuleResult("verify.ok", True),)
    assert cp.workflow_version == "3" and cp.created_at == b.events[-1].occurred_at
    assert s.checkpoint == cp and s.checkpoints[-1].offset == pos[1]


def test_verified_with_failed_rule_makes_no_checkpoint() -> None:
    b = RunBuilder("r").start()
    b.add(EventType.STAGE_STARTED, stage="research")
    b.add(EventType.VERIFIED, stage="research", verification=(RuleResult("research.ok", False, "0 sources"),))
    s = fold_all(b.events)
    assert s is not None and s.checkpoint is None and s.completed_stages == () and s.last_seq == 3


def test_stage_without_checkpoint_completes_without_manifest() -> None:
    wf = WorkflowSpec("w", "1", (StageSpec("a", checkpoint=False), StageSpec("b")))
    b = RunBuilder("r").start(wf).stage("a")
    s = fold_all(b.events)
    assert s is not None and s.checkpoint is None and s.completed_stages == ("a",) and s.next_stage == "b"


def test_calls_and_open_intents_for_resume() -> None:
    b = RunBuilder("r").start().stage("research")
    b.add(EventType.STAGE_STARTED, stage="visual")
    done = b.call("visual", 0)
    open_ = b.call("visual", 1, effect=True, result=False)
    s = fold_all(b.events)
    assert s is not None
    assert s.calls[done].status is CallStatus.RESULT and s.calls[done].result == art(f"result-{done}")
    c = s.calls[open_]
    assert c.status is CallStatus.CALLED and c.delivery_key == f"dk-{open_}"
    assert c.args == art(f"args-{open_}")
    assert c.idempotency_key == f"idem-{open_}"
    (intent,) = s.open_intents
    assert intent.status is EffectStatus.INTENT and intent.call_id == open_ and intent.target == "cms:visual"
    b.add(EventType.EFFECT_RECONCILED, stage="visual", call_id=open_, delivery_key=f"dk-{open_}",
          external_id="ext-9", payload_ref=art("reconciled"))
    s2, out = fold(s, b.events[-1])
    (eff,) = out.effects
    assert eff.status is EffectStatus.RECONCILED and eff.external_id == "ext-9" and eff.target == "cms:visual"
    assert s2.open_effects == {} and s2.closed_effects[f"dk-{open_}"] == eff
    assert s2.calls[open_].status is CallStatus.RESULT and s2.calls[open_].result == art("reconciled")


def test_failed_blocked_and_resumed() -> None:
    b = RunBuilder("r").start()
    b.add(EventType.STAGE_STARTED, stage="research")
    b.fail("research")
    s = fold_all(b.events)
    assert s is not None and s.status is RunStatus.FAILED and s.last_error is not None
    b.lease(2)
    s = fold_all(b.events[-1:], s)
    assert s is not None and s.status is RunStatus.RUNNING
    b.add(EventType.RUN_BLOCKED, error=ErrorInfo("policy", "NEVER intent open"))
    s = fold_all(b.events[-1:], s)
    assert s is not None and s.status is RunStatus.BLOCKED
    assert s.last_error == ErrorInfo("policy", "NEVER intent open")


def test_branch_records_parent() -> None:
    b = RunBuilder("child").start()
    b.add(EventType.RUN_BRANCHED, parent_run_id="parent", forked_from_seq=12)
    s = fold_all(b.events)
    assert s is not None and s.parent_run_id == "parent" and s.forked_from_seq == 12


def test_memory_is_bounded() -> None:
    b = RunBuilder("r").start()
    for i in range(CHECKPOINT_WINDOW + 10):
        b.stage("research" if i % 2 else "verify", calls=1)
    for _ in range(REJECTED_WINDOW + 5):
        b.events.append(zombie(b.events[-1], epoch=0, seq=b.seq + 1))
    s = fold_all(b.events)
    assert s is not None
    assert len(s.recent) == DIGEST_WINDOW
    assert len(s.checkpoints) == CHECKPOINT_WINDOW
    assert len(s.recent_rejected) == REJECTED_WINDOW and s.rejected_total == REJECTED_WINDOW + 5
    assert len(s.calls) == 0


def test_wrong_run_is_a_programming_error() -> None:
    s = fold_all(full_run("a", stages=1))
    with pytest.raises(ValueError):
        fold(s, full_run("b", stages=1)[0])


def test_json_round_trip_is_exact() -> None:
    b = RunBuilder("r").start().stage("research").stage("visual", effect=True)
    b.add(EventType.STAGE_STARTED, stage="publish")
    b.call("publish", 0, effect=True, result=False)
    b.events.append(zombie(b.events[-1], epoch=0, seq=99))
    s = fold_all(positioned(b.events))
    assert s is not None and s.open_effects and s.calls and s.rejected
    text = s.to_json()
    back = RunState.from_json(text)
    assert back == s and back.to_json() == text
    assert RunState.from_json(RunState("x").to_json()) == RunState("x")
