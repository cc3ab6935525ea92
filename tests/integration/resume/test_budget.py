"""Budgets (``runlog.producers.Budget``, ``runlog budget``): a model call that would spend past a hard cap
is not made; the run waits for a person who raises the cap (an event on the log, with who and why)
or fails, as declared; a soft cap is a warning on the log; a run crashed at its cap and resumed
does not spend past it. Real broker and Redis; a Pydantic AI agent on a ``FunctionModel`` whose
responses say what they used (no network).

What each test would catch: a call made past the cap (the model's own count of requests), a run
that does not wait or fail as declared, a raise that is not on the log or does not resume the run,
a resume that forgets what the run spent before its crash."""

from __future__ import annotations

import contextlib
from typing import Any

import pytest
from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel
from pydantic_ai.usage import RequestUsage

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.budget import raise_budget
from runlog.processors.cli import main
from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.operate import OperatorRefused
from runlog.processors.resume import App, Resumer
from runlog.producers import AsyncStageContext, Budget, DictInputSource, Runner, Workflow
from runlog.producers.pydantic_ai import RunlogAgent
from runlog.projections import RunStatus
from runlog.projections._budget import BUDGET_SIGNAL, SOFT_ATTRIBUTE
from runlog.schemas import EventType, Settings
from tests.integration.resume._toy import Abandon
from tests.integration.resume.conftest import accepted, log_of

pytestmark = pytest.mark.integration

# turn t uses 1000 + 100 t input and 40 + t output tokens: 1,040 / 2,181 / 3,423 / 4,766 in all
SPENT_AFTER = (1040, 2181, 3423, 4766)


class _Model:
    """Four requests: three lookups, then the answer; counts the requests it answered."""

    def __init__(self) -> None:
        self.requests = 0
        self.abandon_lookup_at: int | None = None
        self.lookups = 0

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        self.requests += 1
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        done = sum(isinstance(p, ToolReturnPart) for m in messages for p in m.parts)
        part = ToolCallPart("lookup", {"n": done}) if done < 3 else TextPart(f"found {done}")
        return ModelResponse(parts=[part], usage=RequestUsage(input_tokens=1000 + 100 * turn,
                                                              output_tokens=40 + turn))

    def lookup(self, n: int) -> dict[str, int]:
        self.lookups += 1
        if self.abandon_lookup_at is not None and n == self.abandon_lookup_at:
            self.abandon_lookup_at = None
            raise Abandon(f"the worker died in lookup {n}")
        return {"fact": n * n}


def _app(model: _Model, budget: Budget | None) -> App:
    agent = Agent(FunctionModel(model.respond, model_name="m"), name="spender")
    agent.tool_plain(model.lookup)
    durable = RunlogAgent(agent)
    wf = Workflow("budgeted", "1", budget=budget)

    @wf.stage("research")
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answer": (await durable.run(ctx, "look three things up")).output}

    return App.of([wf], durable.tools(), DictInputSource({}))


def _start(settings: Settings, app: App, *, budget: Budget | None = None) -> tuple[str, Any]:
    with Runner.from_settings(settings, source=app.source, prices=app.prices) as runner:
        h = runner.start_run(app.registry.get("budgeted"), {}, budget=budget)
        assert h.session is not None
        try:
            res = runner.execute(h.session)
        except Exception as err:  # noqa: BLE001 -- a failed run is a result here
            res = err
    return h.run_id, res


def _state(settings: Settings, app: App, run_id: str) -> Any:
    with Resumer(settings, app) as r:
        return r.load(run_id)[0]


def _tokens(state: Any) -> int:
    return int(state.total_usage.input_tokens + state.total_usage.output_tokens)


def test_a_hard_cap_stops_the_next_call_and_the_run_waits_until_a_person_raises_it(
        topics: Settings, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    model = _Model()
    app = _app(model, Budget(tokens=2500))
    run_id, res = _start(topics, app)
    assert getattr(res, "waiting", None) == BUDGET_SIGNAL and not res.completed
    # 2,181 tokens after the second request; the third (about 1,091, the average) would pass 2,500
    assert model.requests == 2
    state = _state(topics, app, run_id)
    assert state.status is RunStatus.WAITING and state.waiting.signal == BUDGET_SIGNAL
    assert _tokens(state) == SPENT_AFTER[1]
    waiting = [le.event for le in accepted(log_of(topics, run_id)) if le.event.type is EventType.RUN_WAITING]
    why = waiting[-1].attributes["reason"]
    assert "token budget: 2181 of 2500 tokens spent; the next call (about 1091" in why, why

    with Resumer(topics, app) as r:  # a plain resume does not spend past the cap
        assert r.resume(run_id).result == "waiting"
    assert model.requests == 2
    with pytest.raises(OperatorRefused, match="--reason"):
        raise_budget(topics, run_id, tokens=10_000, by="ops-ana", reason="")
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    capsys.readouterr()
    assert main(["budget", run_id, "--tokens", "10000", "--by", "ops-ana",
                 "--reason", "the customer approved more"]) == 0
    assert "budget set (tokens=10000); resume requested" in capsys.readouterr().out
    with Resumer(topics, app) as r:
        assert r.resume(run_id).result == "completed"
    assert model.requests == 4
    state = _state(topics, app, run_id)
    assert state.status is RunStatus.COMPLETED and _tokens(state) == SPENT_AFTER[3]
    assert state.usage_budget is not None and state.usage_budget.tokens == 10_000
    # the audit shows who raised it and why
    report = audit(topics, AuditOptions(run_id=run_id, check_artifacts=False), progress=None)
    raised = [a for a in report.runs[run_id].to_dict()["operator_actions"] if a["type"] == "SIGNAL_RECEIVED"]
    assert [(a["by"], a["why"]) for a in raised] == [("ops-ana", "the customer approved more")]


def test_a_run_killed_at_its_cap_and_resumed_does_not_spend_past_it(topics: Settings) -> None:
    model = _Model()
    model.abandon_lookup_at = 2  # the third response (3,423 tokens) is recorded, then the worker dies
    app = _app(model, None)
    with contextlib.suppress(Abandon):
        _start(topics, app, budget=Budget(tokens=4000))  # a run's own budget
    assert model.requests == 3
    run_id = next(iter(_runs(topics, app)))
    wait_lease_gone(topics, run_id, 10)
    with Resumer(topics, app) as r:
        out = r.resume(run_id)
    assert out.result == "waiting", out
    # the recorded spend counted, once: 3,423 + about 1,141 would pass 4,000, the fourth is not made
    assert model.requests == 3
    assert _tokens(_state(topics, app, run_id)) == SPENT_AFTER[2]


def _runs(settings: Settings, app: App) -> list[str]:
    from runlog.processors.inspect.log import runs_from_log

    return [r for r, st in runs_from_log(settings).items() if st.workflow and st.workflow.name == "budgeted"]


def test_on_exceeded_fail_fails_the_run_and_a_soft_cap_warns_on_the_log(topics: Settings) -> None:
    model = _Model()
    app = _app(model, Budget(tokens=2000, soft_tokens=1000, on_exceeded="fail"))
    run_id, res = _start(topics, app)
    assert isinstance(res, Exception), res
    assert model.requests == 1  # 1,040 tokens after the first: the second (about 1,040) would pass 2,000
    state = _state(topics, app, run_id)
    assert state.status is RunStatus.FAILED and state.last_error is not None
    assert state.last_error.kind == "BudgetExceeded", state.last_error
    results = [le.event for le in accepted(log_of(topics, run_id)) if le.event.type is EventType.TOOL_RESULT
               and le.event.usage is not None]
    assert [e.attributes.get(SOFT_ATTRIBUTE) for e in results] == ["tokens 1040 >= soft cap 1000"]
    # raised by an operator: a resume is requested (the resumers go on with it, as with a waiting run),
    # and the run continues and makes the calls it was refused
    raised = raise_budget(topics, run_id, tokens=9000, by="ops", reason="approved")
    assert raised.detail.endswith("; resume requested"), raised.detail
    with Resumer(topics, app) as r:
        assert r.resume(run_id).result == "completed"
    assert model.requests == 4 and _tokens(_state(topics, app, run_id)) == SPENT_AFTER[3]
