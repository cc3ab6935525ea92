"""A durable Pydantic AI agent as a workflow, and the worker process the crash matrix kills.

Workflow ``agent-shop`` (two ``async def`` stages, one agent spanning both):

* ``research``: the agent looks the price up (model -> ``lookup``, a SAFE tool -> model) and
  passes its messages on;
* ``order``: the agent continues the conversation and saves the order (model -> ``save_order``,
  a ``RECONCILE_FIRST`` effect that inserts a row into a local SQLite file whose delivery-key
  column is unique -> model).

The model is a Pydantic AI ``FunctionModel`` (no network). What really happened is counted in
files under the world directory: ``model.log`` (one line per model request: its turn),
``lookup.log`` (one line per lookup), ``attempts.log`` (one line per entry into the effect), and
the rows of ``orders.db``.

Run as a worker: ``python -m tests.integration.resume._pydantic_ai_agent --dir D [--order o-1]
[--sdk sync|async]`` prints ``run_id=<id>`` and executes one run (with ``RUNLOG_CRASH_AT`` it
SIGKILLs itself at that point).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pydantic_ai import Agent
from pydantic_ai.messages import (
    ModelMessage,
    ModelResponse,
    TextPart,
    ToolCallPart,
    ToolReturnPart,
    UserPromptPart,
)
from pydantic_ai.models.function import AgentInfo, FunctionModel

from runlog.processors.resume import App
from runlog.producers import AsyncRunner, AsyncStageContext, DictInputSource, Runner, Workflow, rule, tool
from runlog.producers.crash import arm_from_env
from runlog.producers.pydantic_ai import RunlogAgent, current_call, dump_messages, load_messages
from runlog.schemas import ReplayPolicy, Settings
from tests.integration.resume._workers import spawn_worker

ACCOUNT = "acct-agent"
MODEL_TOOL = "pydantic_ai.model.shop"
LOOKUP_TOOL = "pydantic_ai.tool.shop.lookup"
SAVE_TOOL = "orders.save_row"


class ShopWorld:
    """The world's files: what the model and the tools really did."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS rows (delivery_key TEXT NOT NULL UNIQUE, "
                       "order_id TEXT NOT NULL, price INTEGER NOT NULL, epoch INTEGER NOT NULL)")

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.root / "orders.db", timeout=30, isolation_level=None)

    def _line(self, name: str, text: str) -> None:
        with (self.root / name).open("a") as f:
            f.write(text + "\n")

    def _lines(self, name: str) -> list[str]:
        p = self.root / name
        return p.read_text().splitlines() if p.exists() else []

    def model_turns(self) -> list[int]:
        return [int(x) for x in self._lines("model.log")]

    def lookups(self) -> int:
        return len(self._lines("lookup.log"))

    def attempts(self) -> int:
        return len(self._lines("attempts.log"))

    def rows(self) -> list[tuple[str, str, int]]:
        with self._db() as db:
            return list(db.execute("SELECT delivery_key, order_id, price FROM rows"))

    # -- the model and the tools ------------------------------------------------------------------

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        """Look the price up; when only asked to look, answer; else save the order, then answer."""
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        self._line("model.log", str(turn))
        prompts = [str(p.content) for m in messages for p in m.parts if isinstance(p, UserPromptPart)]
        returns = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
        if "lookup" not in returns:
            return ModelResponse(parts=[ToolCallPart("lookup", {"sku": prompts[-1].split()[-1]})])
        price = returns["lookup"]["price"]
        if prompts[-1].startswith("look up"):
            return ModelResponse(parts=[TextPart(f"the price is {price}")])
        if "save_order" not in returns:
            order = prompts[-1].split()[-1]
            return ModelResponse(parts=[ToolCallPart("save_order", {"order": order, "price": price})])
        return ModelResponse(parts=[TextPart(f"saved {returns['save_order']['external_id']}")])

    def lookup(self, sku: str) -> dict[str, Any]:
        self._line("lookup.log", sku)
        return {"sku": sku, "price": 1200}

    async def save_order(self, order: str, price: int) -> dict[str, Any]:
        call = current_call()
        self._line("attempts.log", call.call_id)
        with self._db() as db:  # a second insert for one delivery key raises: never silently twice
            db.execute("INSERT INTO rows VALUES (?, ?, ?, ?)", (call.delivery_key, order, price, call.epoch))
        return {"external_id": f"row-{order}"}

    def find_row(self, delivery_key: str, args: Mapping[str, Any]) -> Mapping[str, Any] | None:
        with self._db() as db:
            found = db.execute("SELECT order_id FROM rows WHERE delivery_key = ?", (delivery_key,)).fetchone()
        return {"external_id": f"row-{found[0]}"} if found else None


def agent_app(root: Path) -> App:
    """The application (workflow, tools, inputs) on the world under ``root``."""
    world = ShopWorld(root)
    agent = Agent(FunctionModel(world.respond), name="shop")
    agent.tool_plain(world.lookup)
    agent.tool_plain(world.save_order)
    save = tool(SAVE_TOOL, policy=ReplayPolicy.RECONCILE_FIRST, target="sqlite:orders",
                delivery=lambda args, call: (ACCOUNT, "sqlite", str(args["order"]), "1"),
                reconcile=world.find_row)(world.save_order)
    durable = RunlogAgent(agent, tools={"save_order": save})

    wf = Workflow("agent-shop", version="1")

    @wf.stage("research", rules=[rule("priced", lambda out: out["answer"].startswith("the price is"))])
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, f"look up {ctx.params['sku']}")
        return {"answer": result.output, "messages": dump_messages(result.all_messages())}

    @wf.stage("order", rules=[rule("saved", lambda out: out["answer"].startswith("saved row-"))])
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        history = load_messages(ctx.output_of("research")["messages"])
        result = await durable.run(ctx, f"now save order {ctx.params['order']}", message_history=history)
        return {"answer": result.output}

    return App.of([wf], durable.tools(), DictInputSource({}), name="agent-shop")


def spawn(settings: Settings, root: Path, *, order: str = "o-1", sdk: str = "sync",
          crash_at: str | None = None) -> subprocess.Popen[str]:
    """A worker process running one agent-shop run (crashing at ``crash_at`` when given)."""
    return spawn_worker("tests.integration.resume._pydantic_ai_agent",
                        ["--dir", str(root), "--order", order, "--sdk", sdk], settings, crash_at=crash_at)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one agent-shop workflow")
    p.add_argument("--dir", required=True)
    p.add_argument("--order", default="o-1")
    p.add_argument("--sdk", default="sync", choices=["sync", "async"])
    a = p.parse_args(argv)
    arm_from_env()
    settings = Settings.from_env()
    app = agent_app(Path(a.dir))
    wf = app.registry.get("agent-shop")
    params = {"order": a.order, "sku": "sku-1"}
    if a.sdk == "async":
        async def go() -> bool:
            async with AsyncRunner.from_settings(settings, source=app.source) as runner:
                handle = await runner.start_run(wf, params)
                print(f"run_id={handle.run_id}", flush=True)
                assert handle.session is not None
                return (await runner.execute(handle.session)).completed

        completed = asyncio.run(go())
    else:
        with Runner.from_settings(settings, source=app.source) as runner:
            handle = runner.start_run(wf, params)
            print(f"run_id={handle.run_id}", flush=True)
            assert handle.session is not None
            completed = runner.execute(handle.session).completed
    print(f"completed={completed}", flush=True)
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
