"""Workflow definitions, rule evaluation and tool declarations (pure)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from runlog.producers import CallInfo, RetryPolicy, Workflow, WorkflowRegistry, rule, tool
from runlog.producers.base._protocol import Invoke, Mode, Sleep, Step, Steps, drive
from runlog.producers.define._tools import retry_steps
from runlog.producers.define._workflow import evaluate_rules
from runlog.schemas import ReplayPolicy, RuleResult, StageSpec
from runlog.schemas.errors import RetryableToolError, TerminalToolError, WorkflowDefinitionError


def _wf() -> Workflow:
    wf = Workflow("content", version="3")

    @wf.stage("research", inputs=["facts"], rules=[rule("results.count >= 3",
                                                        lambda o: len(o["results"]) >= 3)])
    def research(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"results": []}

    @wf.stage("draft", inputs=["style", "facts"], checkpoint=False)
    def draft(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}

    return wf


def test_spec_records_order_inputs_rules_and_version() -> None:
    spec = _wf().spec()
    assert (spec.name, spec.version) == ("content", "3")
    assert spec.stages == (
        StageSpec("research", ("facts",), ("results.count >= 3",), True),
        StageSpec("draft", ("style", "facts"), (), False),
    )
    assert spec.next_stage("research") == "draft"
    assert _wf().input_names() == ("facts", "style")


def test_duplicate_stage_is_refused() -> None:
    wf = _wf()
    with pytest.raises(WorkflowDefinitionError, match="declared twice"):
        wf.stage("draft")(lambda ctx, inputs: {})


def test_empty_workflow_has_no_spec() -> None:
    with pytest.raises(WorkflowDefinitionError, match="no stages"):
        Workflow("w", "1").spec()


def test_registry_by_name_and_version() -> None:
    wf = _wf()
    reg = WorkflowRegistry([wf])
    assert reg.get("content") is wf and reg.get("content", "3") is wf and "content" in reg
    with pytest.raises(WorkflowDefinitionError, match="version"):
        reg.get("content", "2")
    with pytest.raises(WorkflowDefinitionError, match="no workflow"):
        reg.get("other")
    with pytest.raises(WorkflowDefinitionError, match="already registered"):
        reg.register(_wf())  # another definition at the same version


def test_a_registry_serves_several_versions_of_one_name() -> None:
    v1, v2, v10 = Workflow("orders", "1"), Workflow("orders", "2"), Workflow("orders", "1.10")
    reg = WorkflowRegistry([v2, v10, v1])
    assert reg.get("orders", "1") is v1 and reg.get("orders", "2") is v2 and reg.get("orders", "1.10") is v10
    assert reg.versions("orders") == ("1", "1.10", "2")  # dotted numbers, not text order
    assert reg.get("orders") is v2  # a new run starts on the newest
    assert reg.serves("orders", "1") and not reg.serves("orders", "3") and not reg.serves("other", "1")
    assert reg.served() == (("orders", "1"), ("orders", "1.10"), ("orders", "2"))
    assert sorted(w.version for w in reg) == ["1", "1.10", "2"] and reg.names() == ("orders",)
    with pytest.raises(WorkflowDefinitionError, match=r"version '1', '1\.10', '2', not '3'"):
        reg.get("orders", "3")
    # versions that are not numbers: the newest is the one registered last
    named = WorkflowRegistry([Workflow("x", "blue"), Workflow("x", "green")])
    assert named.get("x").version == "green" and named.versions("x") == ("blue", "green")


def test_rules_pass_fail_and_explain() -> None:
    rules = [
        rule("image.count == 3", lambda o: len(o["images"]) == 3),
        rule("image.watermark == false", lambda o: (not o["watermark"], f"watermark={o['watermark']}")),
        rule("title present", lambda o: bool(o["title"])),
    ]
    out = {"images": [1, 2, 3], "watermark": True}
    res = evaluate_rules(rules, out)
    assert res[0] == RuleResult("image.count == 3", True, None)
    assert res[1] == RuleResult("image.watermark == false", False, "watermark=True")
    assert res[2].passed is False and res[2].detail is not None and "KeyError" in res[2].detail


def test_rule_returning_non_bool_fails() -> None:
    [r] = evaluate_rules([rule("truthy", lambda o: o["n"])], {"n": 5})
    assert not r.passed and "not bool" in (r.detail or "")


def test_reconcile_first_without_reconcile_is_rejected_at_definition() -> None:
    with pytest.raises(WorkflowDefinitionError, match="RECONCILE_FIRST but no reconcile function"):
        @tool("publish", policy=ReplayPolicy.RECONCILE_FIRST, target="platform:articles",
              delivery=lambda a, c: ("acct", "blog", a["slug"], "1"))
        def publish(call: CallInfo, slug: str) -> dict[str, Any]:
            return {"external_id": slug}


def test_never_and_reconcile_first_are_effect_tools() -> None:
    @tool("charge", policy=ReplayPolicy.NEVER, target="billing:charges",
          delivery=lambda a, c: ("acct", "billing", c.run_id, "1"))
    def charge(call: CallInfo) -> dict[str, Any]:
        return {"external_id": "ch_1"}

    assert charge.effect
    with pytest.raises(WorkflowDefinitionError, match="effect tools"):
        tool("charge2", policy=ReplayPolicy.NEVER, effect=False)
    with pytest.raises(WorkflowDefinitionError, match="target"):
        tool("charge3", policy=ReplayPolicy.NEVER)(lambda call: None)
    with pytest.raises(WorkflowDefinitionError, match="delivery"):
        tool("upload", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="cdn:assets")(lambda call: None)


def test_retry_policy_delays() -> None:
    p = RetryPolicy(attempts=4, backoff=0.5, multiplier=2, max_backoff=1.5)
    assert list(p.delays()) == [0.5, 1.0, 1.5]
    assert list(RetryPolicy().delays()) == []
    with pytest.raises(WorkflowDefinitionError):
        RetryPolicy(attempts=0)


class _Recording(Mode):
    """Runs user code, records back-offs instead of sleeping them."""

    def __init__(self) -> None:
        self.slept: list[float] = []

    def run(self, step: Step[Any]) -> Any:
        if isinstance(step, Sleep):
            self.slept.append(step.seconds)
            return None
        assert isinstance(step, Invoke)
        return step.fn(*step.args)


def _retry(fn: Callable[[int], str], policy: RetryPolicy, slept: list[float],
           checked: list[int]) -> tuple[Any, int]:
    def attempt(n: int) -> Steps[str]:
        return (yield from Invoke(fn, (n,)))

    def before(n: int) -> Steps[None]:
        checked.append(n)
        return
        yield  # a generator with no steps

    mode = _Recording()
    try:
        return drive(retry_steps(attempt, policy, before), mode)
    finally:
        slept.extend(mode.slept)


def test_retry_steps_retry_only_retryable_errors() -> None:
    slept: list[float] = []
    checked: list[int] = []
    seen: list[int] = []

    def flaky(attempt: int) -> str:
        seen.append(attempt)
        if attempt < 3:
            raise RetryableToolError("503")
        return "ok"

    assert _retry(flaky, RetryPolicy(3, 0.1), slept, checked) == ("ok", 3)
    assert seen == [1, 2, 3] and slept == [0.1, 0.2]
    assert checked == [2, 3]  # the lease is checked before each retry

    calls: list[int] = []

    def always(attempt: int) -> str:
        calls.append(attempt)
        raise RetryableToolError("503")

    with pytest.raises(RetryableToolError):
        _retry(always, RetryPolicy(2, 0), [], [])
    assert calls == [1, 2]

    terminal: list[int] = []

    def broken(attempt: int) -> str:
        terminal.append(attempt)
        raise TerminalToolError("bad request")

    with pytest.raises(TerminalToolError):
        _retry(broken, RetryPolicy(5, 0), [], [])
    assert terminal == [1]  # a terminal error is not retried
