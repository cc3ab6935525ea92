"""``runlog replay`` (counterfactual replay for evaluation) over the orders workflow and the demo
world's services: a replay never executes an effect, serves recorded results whose requests match,
and stops at an effect whose request changed. Real broker, Redis and demo world.

What each test would catch: a replay that charges, reserves or emails again (the services' own
counts), that writes into the live namespace (the live topics' and projection's contents), that
serves a result to a changed request, or whose report misstates what happened."""

from __future__ import annotations

from pathlib import Path

import pytest

from runlog.processors.replay import ANEW, NOT_MADE, SERVED, STOPPED, replay_cohort, replay_run, summary_table
from runlog.producers import Runner
from runlog.projections import RedisStore, RunStatus
from runlog.schemas import Settings
from tests.integration.resume._orders import orders_app
from tests.integration.resume.conftest import DemoWorld, log_of, project

pytestmark = pytest.mark.integration


def _orders(settings: Settings, world: DemoWorld, n: int) -> list[str]:
    app = orders_app(world.client)
    ids = []
    with Runner.from_settings(settings, source=app.source) as runner:
        for i in range(n):
            res = runner.run(app.registry.get("orders"), {"order": f"r-{i}", "mode": "ctx"})
            assert res.completed
            ids.append(res.run_id)
    return ids


def test_a_cohort_replayed_with_another_model_makes_no_effect_and_reports_what_changed(
        topics: Settings, world: DemoWorld) -> None:
    ids = _orders(topics, world, 20)
    project(topics)
    before = world.stats()
    assert (before["charges"], before["assets"], before["publishes"]) == (20, 20, 20), before
    live = {run_id: len(log_of(topics, run_id)) for run_id in ids}
    app = orders_app(world.client)
    namespace, reports = replay_cohort(topics, app, "orders", 0, model="test")
    assert sorted(r.run_id for r in reports) == sorted(ids)
    after = world.stats()
    keys = ("charges", "uploads", "assets", "publishes", "research_calls")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}, reports[0].calls  # not even a search
    for rep in reports:
        assert rep.namespace == namespace and rep.status == "completed", (rep.status, rep.reason)
        assert rep.outputs == {"pick": "same", "pay": "same", "notify": "same"}, rep.outputs
        # random, quote, reserve, charge, email: every recorded call served, none run
        assert [(c.tool, c.how) for c in rep.calls] == [
            ("runlog.random", SERVED), ("quote", SERVED), ("reserve", SERVED), ("charge", SERVED),
            ("email", SERVED)], rep.calls
    # the live runs were not touched: their logs are as they were, the replays are elsewhere
    assert {run_id: len(log_of(topics, run_id)) for run_id in ids} == live
    store = RedisStore.from_settings(topics)
    try:
        assert sorted(store.runs(RunStatus.COMPLETED)) == sorted(ids)
    finally:
        store.client.close()
    table = summary_table(reports)
    assert len(table.splitlines()) == 21 and all(r.run_id in table for r in reports)


def test_a_changed_parameter_stops_the_replay_at_the_effect_whose_request_changed(
        topics: Settings, world: DemoWorld) -> None:
    (run_id,) = _orders(topics, world, 1)
    before = world.stats()
    rep = replay_run(topics, orders_app(world.client), run_id, set_params={"order": "r-other"})
    assert rep.status == "stopped" and "reserve" in rep.reason
    assert "request is not the recorded one" in rep.reason
    assert rep.params["order"] == "r-other"
    hows = {c.tool: c.how for c in rep.calls}
    assert hows == {"runlog.random": SERVED, "quote": SERVED, "reserve": STOPPED, "charge": NOT_MADE,
                    "email": NOT_MADE}, rep.calls
    assert rep.outputs == {"pick": "not reached", "pay": "not reached", "notify": "not reached"}
    after = world.stats()
    keys = ("charges", "uploads", "assets", "publishes")
    assert {k: after[k] for k in keys} == {k: before[k] for k in keys}


def test_an_agent_replayed_calls_its_model_anew_and_with_another_model_never_saves_again(
        topics: Settings, tmp_path: Path) -> None:
    from tests.integration.resume._pydantic_ai_agent import (
        LOOKUP_TOOL,
        MODEL_TOOL,
        SAVE_TOOL,
        ShopWorld,
        agent_app,
    )

    root = tmp_path / "shop"
    app = agent_app(root)
    world = ShopWorld(root)
    with Runner.from_settings(topics, source=app.source, prices=app.prices) as runner:
        res = runner.run(app.registry.get("agent-shop"), {"sku": "sku-1", "order": "o-9"})
    assert res.completed
    turns, lookups, rows = len(world.model_turns()), world.lookups(), world.rows()
    assert (lookups, len(rows), world.attempts()) == (1, 1, 1)

    same = replay_run(topics, app, res.run_id)  # the same model: asked again, answers alike
    assert same.status == "completed", same.reason
    # the same answers and messages (their times are no change): an unchanged run replays unchanged
    assert same.outputs == {"research": "same", "order": "same"}, same.outputs
    assert len(world.model_turns()) == 2 * turns  # every model request made anew
    assert (world.lookups(), world.rows(), world.attempts()) == (lookups, rows, 1)  # tools served
    hows = {(c.tool, c.how) for c in same.calls}
    assert hows == {(MODEL_TOOL, ANEW), (LOOKUP_TOOL, SERVED), (SAVE_TOOL, SERVED)}, same.calls

    other = replay_run(topics, app, res.run_id, model="test")  # Pydantic AI's TestModel, no network
    assert len(world.model_turns()) == 2 * turns  # the agent's own model was not asked
    assert other.model == "test" and other.status == "stopped", other.reason
    assert f"effect {SAVE_TOOL} (RECONCILE_FIRST) not made in a replay" in other.reason, other.reason
    assert (world.rows(), world.attempts()) == (rows, 1)  # the order was never saved again
    # TestModel asks for every tool in its first response: the save is stopped inside research
    assert other.outputs == {"research": "not reached", "order": "not reached"}, other.outputs


def test_a_replay_leaves_no_namespace_behind_unless_kept_and_clean_deletes_kept_ones(
        topics: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    import runlog.processors.resume
    from runlog.processors.admin import admin_client
    from runlog.processors.cli import main
    from runlog.processors.replay import eval_namespaces
    from runlog.schemas._redis import redis_client
    from tests.integration.resume._toy import toy

    t = toy("replayed")
    t.crashing = False
    app = t.app(name="replayed")
    with Runner.from_settings(topics, source=app.source) as runner:
        run_id = runner.run(t.workflow, {"q": "r"}).run_id
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setattr(runlog.processors.resume, "load_app", lambda spec: app)

    def left(namespace: str) -> tuple[list[str], list[bytes]]:
        names = admin_client(topics).list_topics(timeout=30).topics
        client = redis_client(topics)
        try:
            keys = list(client.scan_iter(match=f"{topics.redis_prefix}:{namespace}:*"))
        finally:
            client.close()
        return [n for n in names if n.startswith(f"{topics.topic_prefix}{namespace}.")], keys

    assert main(["replay", run_id, "--app", "toy:app", "--json"]) == 0
    dropped = json.loads(capsys.readouterr().out)
    assert dropped["kept"] is False and dropped["replays"][0]["status"] == "completed"
    assert left(dropped["namespace"]) == ([], [])

    assert main(["replay", run_id, "--app", "toy:app", "--json", "--keep"]) == 0
    kept = json.loads(capsys.readouterr().out)["namespace"]
    topics_left, keys_left = left(kept)
    assert topics_left and keys_left  # the replay's log and projection, to read it
    assert eval_namespaces(topics) == [kept]
    assert main(["replay", "clean"]) == 0
    assert f"deleted {kept}" in capsys.readouterr().out
    assert left(kept) == ([], []) and eval_namespaces(topics) == []


def test_an_openai_agents_run_replayed_with_another_model_asks_that_model(topics: Settings,
                                                                           tmp_path: Path) -> None:
    """``runlog replay --model`` reached Pydantic AI agents only: an OpenAI Agents SDK agent was
    replayed on its own model while the report named the other one."""
    from tests.integration.resume import _openai_agents_agent as shop
    from tests.integration.resume._shop_world import ShopWorld

    app = shop.agent_app(tmp_path / "shop")
    world = ShopWorld(tmp_path / "shop")
    with Runner.from_settings(topics, source=app.source, prices=app.prices) as runner:
        res = runner.run(app.registry.get("oa-shop"), {"sku": "sku-1", "order": "o-9"})
    assert res.completed
    turns = len(world.model_turns())
    other = replay_run(topics, app, res.run_id, model=shop.OTHER_MODEL)
    assert other.model == shop.OTHER_MODEL
    assert len(world.model_turns()) == turns, "the agent's own model was asked"
    # its answer is no price: the research stage fails its rule, and nothing after it is made
    assert other.status == "failed" and "priced" in other.reason, other.reason
    assert (len(world.rows()), world.attempts()) == (1, 1)  # the order was never saved again


@pytest.mark.parametrize(("module", "workflow"), [("_pydantic_ai_agent", "agent-shop"),
                                                  ("_openai_agents_agent", "oa-shop")])
def test_an_unchanged_agent_run_replays_with_no_change_and_leaves_no_namespace(
        topics: Settings, tmp_path: Path, module: str, workflow: str) -> None:
    import importlib

    from runlog.processors.admin import admin_client
    from runlog.processors.replay import drop_namespace

    shop = importlib.import_module(f"tests.integration.resume.{module}")
    app = shop.agent_app(tmp_path / "shop")
    with Runner.from_settings(topics, source=app.source, prices=app.prices) as runner:
        res = runner.run(app.registry.get(workflow), {"sku": "sku-1", "order": "o-9"})
    assert res.completed
    rep = replay_run(topics, app, res.run_id)  # the same model, asked again: it answers alike
    assert rep.status == "completed", rep.reason
    assert set(rep.outputs.values()) == {"same"}, rep.outputs
    assert rep.replay_usage == rep.recorded_usage  # the same prompts: the same tokens
    drop_namespace(topics, rep.namespace)
    left = [t for t in admin_client(topics).list_topics(timeout=30).topics
            if t.startswith(f"{topics.topic_prefix}{rep.namespace}.")]
    assert left == []
