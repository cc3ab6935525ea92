"""A durable OpenAI Agents SDK agent as a workflow, and the worker process the crash matrix kills.

Workflow ``oa-shop`` (two ``async def`` stages, one agent spanning both):

* ``research``: the agent looks the price up (model -> ``lookup``, a SAFE function tool -> model)
  and passes its items on (``result.to_input_list()``);
* ``order``: the agent continues the conversation and saves the order (model -> ``save_order``,
  a ``RECONCILE_FIRST`` effect that inserts a row into a local SQLite file whose delivery-key
  column is unique -> model).

The model implements the SDK's ``Model`` interface and answers with scripted ``ModelResponse``s
built from the SDK's ``agents.testing`` items (no network); each response reports token usage.
What really happened is counted in files under the world directory: ``model.log`` (one line per
model call: its turn), ``lookup.log`` (one line per lookup), ``attempts.log`` (one line per entry
into the effect), and the rows of ``orders.db``.

Run as a worker: ``python -m tests.integration.resume._openai_agents_agent --dir D [--order o-1]
[--sdk sync|async]`` prints ``run_id=<id>`` and executes one run (with ``RUNLOG_CRASH_AT`` it
SIGKILLs itself at that point).
"""

from __future__ import annotations

import argparse
import ast
import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator, Mapping
from pathlib import Path
from typing import Any

from agents import Agent, ModelResponse, RunConfig, function_tool
from agents.items import TResponseStreamEvent
from agents.models.interface import Model
from agents.testing import assistant_message, function_call
from agents.usage import Usage as AgentsUsage

from runlog.processors.resume import App
from runlog.producers import (
    AsyncRunner,
    AsyncStageContext,
    DictInputSource,
    Price,
    Runner,
    Workflow,
    rule,
    tool,
)
from runlog.producers.crash import arm_from_env
from runlog.producers.openai_agents import RunlogAgent, current_call
from runlog.schemas import ReplayPolicy, Settings
from tests.integration.resume._workers import spawn_worker

ACCOUNT = "acct-oa-agent"
MODEL_NAME = "gpt-shop"
MODEL_TOOL = "openai_agents.model.shop"
LOOKUP_TOOL = "openai_agents.tool.shop.lookup"
SAVE_TOOL = "orders.oa_save_row"
PRICES = {MODEL_NAME: Price(input=2, output=8)}
CONFIG = RunConfig(tracing_disabled=True)


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


class ShopWorld(Model):
    """The world's files (what the model and the tools really did), and the model itself."""

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

    # -- the model (the SDK's Model interface) and the tools ---------------------------------------

    async def get_response(self, system_instructions: str | None, input: Any, model_settings: Any,
                           tools: Any, output_schema: Any, handoffs: Any, tracing: Any, *,
                           previous_response_id: str | None, conversation_id: str | None,
                           prompt: Any) -> ModelResponse:
        """Look the price up; when only asked to look, answer; else save the order, then answer."""
        items = [{"role": "user", "content": input}] if isinstance(input, str) else list(input)
        turn = sum(_get(i, "type") == "function_call" or _get(i, "role") == "assistant" for i in items)
        self._line("model.log", str(turn))
        prompts = [str(_get(i, "content")) for i in items if _get(i, "role") == "user"]
        returns = {_get(i, "call_id"): ast.literal_eval(_get(i, "output")) for i in items
                   if _get(i, "type") == "function_call_output"}
        usage = AgentsUsage(requests=1, input_tokens=500 + 100 * turn, output_tokens=20,
                            total_tokens=520 + 100 * turn)
        if "call-lookup" not in returns:
            out = [function_call("lookup", {"sku": prompts[-1].split()[-1]}, call_id="call-lookup")]
        elif prompts[-1].startswith("look up"):
            out = [assistant_message(f"the price is {returns['call-lookup']['price']}")]
        elif "call-save" not in returns:
            args = {"order": prompts[-1].split()[-1], "price": returns["call-lookup"]["price"]}
            out = [function_call("save_order", args, call_id="call-save")]
        else:
            out = [assistant_message(f"saved {returns['call-save']['external_id']}")]
        return ModelResponse(output=out, usage=usage, response_id=f"resp-{turn}")

    async def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise NotImplementedError("not streamed")
        yield  # pragma: no cover

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


def agent_app(root: Path, *, instructions: str = "Look prices up, then save the order.") -> App:
    """The application (workflow, tools, inputs, prices) on the world under ``root`` (the agent's
    ``instructions`` changed: another version of the code, whose model calls diverge)."""
    world = ShopWorld(root)

    @function_tool
    def lookup(sku: str) -> dict[str, Any]:
        """Look a price up."""
        return world.lookup(sku)

    @function_tool(failure_error_function=None)
    async def save_order(order: str, price: int) -> dict[str, Any]:
        """Save an order."""
        return await world.save_order(order, price)

    agent = Agent(name="shop", instructions=instructions, model=world,
                  tools=[lookup, save_order])
    save = tool(SAVE_TOOL, policy=ReplayPolicy.RECONCILE_FIRST, target="sqlite:orders",
                delivery=lambda args, call: (ACCOUNT, "sqlite", str(args["order"]), "1"),
                reconcile=world.find_row)(_not_called)
    durable = RunlogAgent(agent, model_name=MODEL_NAME, tools={"save_order": save})

    wf = Workflow("oa-shop", version="1")

    @wf.stage("research", rules=[rule("priced", lambda out: out["answer"].startswith("the price is"))])
    async def research(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, f"look up {ctx.params['sku']}", run_config=CONFIG)
        return {"answer": result.final_output, "items": result.to_input_list()}

    @wf.stage("order", rules=[rule("saved", lambda out: out["answer"].startswith("saved row-"))])
    async def order(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        items = [*ctx.output_of("research")["items"],
                 {"role": "user", "content": f"now save order {ctx.params['order']}"}]
        result = await durable.run(ctx, items, run_config=CONFIG)
        return {"answer": result.final_output}

    return App.of([wf], durable.tools(), DictInputSource({}), name="oa-shop", prices=PRICES)


def _not_called(call: Any, **args: Any) -> Any:
    raise AssertionError("the mapped tool's fn is not called: the function tool runs in its call")


def spawn(settings: Settings, root: Path, *, order: str = "o-1", sdk: str = "sync",
          crash_at: str | None = None) -> subprocess.Popen[str]:
    """A worker process running one oa-shop run (crashing at ``crash_at`` when given)."""
    return spawn_worker("tests.integration.resume._openai_agents_agent",
                        ["--dir", str(root), "--order", order, "--sdk", sdk], settings, crash_at=crash_at)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one oa-shop workflow")
    p.add_argument("--dir", required=True)
    p.add_argument("--order", default="o-1")
    p.add_argument("--sdk", default="sync", choices=["sync", "async"])
    a = p.parse_args(argv)
    arm_from_env()
    settings = Settings.from_env()
    app = agent_app(Path(a.dir))
    wf = app.registry.get("oa-shop")
    params = {"order": a.order, "sku": "sku-1"}
    if a.sdk == "async":
        async def go() -> bool:
            async with AsyncRunner.from_settings(settings, source=app.source, prices=app.prices) as runner:
                handle = await runner.start_run(wf, params)
                print(f"run_id={handle.run_id}", flush=True)
                assert handle.session is not None
                return (await runner.execute(handle.session)).completed

        completed = asyncio.run(go())
    else:
        with Runner.from_settings(settings, source=app.source, prices=app.prices) as runner:
            handle = runner.start_run(wf, params)
            print(f"run_id={handle.run_id}", flush=True)
            assert handle.session is not None
            completed = runner.execute(handle.session).completed
    print(f"completed={completed}", flush=True)
    return 0 if completed else 1


if __name__ == "__main__":
    sys.exit(main())
