"""Resume's pure decisions: what each replay policy does with an open effect intent, the plan's JSON."""

from __future__ import annotations

from typing import Any

import pytest

from runlog.processors.resume import ResumePlan, plan_effect
from runlog.producers import Tool, tool
from runlog.projections import EffectEntry
from runlog.schemas import ArtifactRef, Checkpoint, EffectStatus, ReplayPolicy


def _effect(policy: ReplayPolicy | None, name: str = "t") -> EffectEntry:
    return EffectEntry(delivery_key="d" * 64, run_id="run-1", target="platform:articles",
                       status=EffectStatus.INTENT, seq=7, updated_at=1, call_id=f"s/{name}/0", tool=name,
                       stage="s", replay_policy=policy)


def _tool(name: str) -> Tool:
    @tool(name, policy=ReplayPolicy.RECONCILE_FIRST, target="platform:articles",
          delivery=lambda args, call: ("a", "p", "o", "1"), reconcile=lambda dk, args: None)
    def fn(call: Any) -> Any:
        return {"external_id": "x"}

    return fn


REF = ArtifactRef("file:///x", "a" * 64, 1)


@pytest.mark.parametrize(("policy", "action"), [
    (ReplayPolicy.SAFE, "rerun"),
    (ReplayPolicy.IDEMPOTENT, "rerun_same_key"),
    (ReplayPolicy.RECONCILE_FIRST, "reconcile"),
    (ReplayPolicy.NEVER, "block"),
    (None, "block"),
])
def test_each_policy_decides_its_action(policy: ReplayPolicy | None, action: str) -> None:
    e = plan_effect(_effect(policy), {}, {"t": _tool("t")})
    assert e.action == action
    assert (e.delivery_key, e.call_id, e.policy) == ("d" * 64, "s/t/0", policy)


def test_never_blocks_with_a_reason_a_person_can_act_on() -> None:
    e = plan_effect(_effect(ReplayPolicy.NEVER, "charge"), {}, {})
    assert "charge" in e.detail and "person" in e.detail and "platform:articles" in e.detail


def test_reconcile_first_without_the_tool_registered_blocks() -> None:
    assert plan_effect(_effect(ReplayPolicy.RECONCILE_FIRST), {}, {}).action == "block"


@pytest.mark.parametrize("policy", list(ReplayPolicy))
def test_a_recorded_result_is_reused_whatever_the_policy(policy: ReplayPolicy) -> None:
    assert plan_effect(_effect(policy), {"s/t/0": REF}, {}).action == "reuse"


def test_plan_to_dict_is_json_ready() -> None:
    cp = Checkpoint("run-1:9", "run-1", 9, 3, 41, "draft", 1, artifacts=(REF,), next_stage="visual")
    plan = ResumePlan("run-1", "RUNNING", 3, 12, cp, [("run-1:12", "ArtifactMissing: x")],
                      artifacts_checked=4, from_stage="visual", reused_calls={"visual/render/0": REF},
                      effects=[plan_effect(_effect(ReplayPolicy.IDEMPOTENT), {}, {})])
    d = plan.to_dict()
    assert d["checkpoint"] == {"checkpoint_id": "run-1:9", "stage": "draft", "last_seq": 9, "offset": 41,
                               "next_stage": "visual", "artifacts": ["file:///x"]}
    assert d["checkpoints_rejected"] == [{"checkpoint_id": "run-1:12", "reason": "ArtifactMissing: x"}]
    assert d["reused_calls"] == ["visual/render/0"]
    assert d["effects"][0]["policy"] == "IDEMPOTENT" and d["effects"][0]["action"] == "rerun_same_key"
    assert d["events_read"] == 12 and d["from_stage"] == "visual" and d["blocked_reason"] is None
