"""Concurrent calls as a workflow, and the worker process the parallel crash matrix kills.

Workflow ``parallel-shop`` (two ``async def`` stages):

* ``fanout``: a durable Pydantic AI agent whose first response asks for three tools at once:
  ``quote`` (SAFE), ``reserve_stock`` and ``send_notice`` (``RECONCILE_FIRST`` effects), which run
  concurrently; its second response answers with their results;
* ``stamp``: ``asyncio.gather`` over two ``ctx.call`` of the ``RECONCILE_FIRST`` effect
  ``stamps.write``.

Each tool sleeps for a duration the worker is given (``--delays``: quote, reserve, notice, stamp 1,
stamp 2), so the tools finish in another order from one run to the next. What really happened is
counted under the world directory: ``model.log`` (one line per model request: its turn),
``quote.log`` (one line per quote) and the ``effects`` table of ``effects.db``: one row per
execution of an effect (no unique key, so an effect done twice shows as two rows).

Run as a worker: ``python -m tests.integration.resume._parallel_agent --dir D --order o-1
--delays 0.1,0.2,0.3,0.1,0.2 [--sdk sync|async]``; prints ``run_id=<id>`` and executes one run
(with ``RUNLOG_CRASH_AT`` it SIGKILLs itself at that point).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
from collections.abc import Mapping, Sequence
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
from runlog.producers import (
    AsyncRunner,
    AsyncStageContext,
    CallInfo,
    DictInputSource,
    Runner,
    Workflow,
    rule,
    tool,
)
from runlog.producers.crash import arm_from_env
from runlog.producers.pydantic_ai import RunlogAgent, current_call
from runlog.schemas import ReplayPolicy, Settings
from tests.integration.resume._workers import Worker, spawn_worker

ACCOUNT = "acct-parallel"
MODEL_TOOL = "pydantic_ai.model.par"
QUOTE_TOOL = "pydantic_ai.tool.par.quote"
RESERVE_TOOL = "stock.reserve"
NOTICE_TOOL = "notices.send"
STAMP_TOOL = "stamps.write"
EFFECTS = ("reserve", "notice", "stamp-1", "stamp-2")


class ParallelWorld:
    """The world's files: what the model and the tools really did, and how long each tool takes."""

    def __init__(self, root: Path, delays: Sequence[float] = (0.0,) * 5) -> None:
        self.root = root
        self.delays = dict(zip(["quote", "reserve", "notice", "stamp-1", "stamp-2"], delays, strict=True))
        root.mkdir(parents=True, exist_ok=True)
        with self._db() as db:
            db.execute("CREATE TABLE IF NOT EXISTS effects "
                       "(effect TEXT NOT NULL, delivery_key TEXT NOT NULL)")

    def _db(self) -> sqlite3.Connection:
        return sqlite3.connect(self.root / "effects.db", timeout=30, isolation_level=None)

    def _line(self, name: str, text: str) -> None:
        with (self.root / name).open("a") as f:
            f.write(text + "\n")

    def _lines(self, name: str) -> list[str]:
        p = self.root / name
        return p.read_text().splitlines() if p.exists() else []

    def model_turns(self) -> list[int]:
        return [int(x) for x in self._lines("model.log")]

    def quotes(self) -> int:
        return len(self._lines("quote.log"))

    def executions(self) -> dict[str, int]:
        """How many times each effect was done in the world."""
        with self._db() as db:
            rows = list(db.execute("SELECT effect, COUNT(*) FROM effects GROUP BY effect"))
        return {e: dict(rows).get(e, 0) for e in EFFECTS}

    # -- the model and the tools ------------------------------------------------------------------

    def respond(self, messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        turn = sum(isinstance(m, ModelResponse) for m in messages)
        self._line("model.log", str(turn))
        if turn == 0:
            prompts = [p.content for m in messages for p in m.parts if isinstance(p, UserPromptPart)]
            order = str(prompts[-1]).split()[-1]
            return ModelResponse(parts=[ToolCallPart("quote", {"sku": "sku-1"}, tool_call_id="q"),
                                        ToolCallPart("reserve_stock", {"order": order}, tool_call_id="r"),
                                        ToolCallPart("send_notice", {"order": order}, tool_call_id="n")])
        got = {p.tool_name: p.content for m in messages for p in m.parts if isinstance(p, ToolReturnPart)}
        return ModelResponse(parts=[TextPart(f"{got['quote']['price']} {got['reserve_stock']['external_id']} "
                                             f"{got['send_notice']['external_id']}")])

    async def quote(self, sku: str) -> dict[str, Any]:
        await asyncio.sleep(self.delays["quote"])
        self._line("quote.log", sku)
        return {"sku": sku, "price": 1200}

    async def _effect(self, effect: str, delivery_key: str, external_id: str) -> dict[str, Any]:
        await asyncio.sleep(self.delays.get(effect, 0.0))
        with self._db() as db:
            db.execute("INSERT INTO effects VALUES (?, ?)", (effect, delivery_key))
        return {"external_id": external_id}

    async def reserve_stock(self, order: str) -> dict[str, Any]:
        return await self._effect("reserve", current_call().delivery_key or "", f"hold-{order}")

    async def send_notice(self, order: str) -> dict[str, Any]:
        return await self._effect("notice", current_call().delivery_key or "", f"notice-{order}")

    async def stamp(self, call: CallInfo, order: str, n: int) -> dict[str, Any]:
        return await self._effect(f"stamp-{n}", call.delivery_key or "", f"stamp-{order}-{n}")

    def find(self, delivery_key: str, args: Mapping[str, Any]) -> Mapping[str, Any] | None:
        """The reconcile function of every effect: the world's record of that delivery key."""
        with self._db() as db:
            found = db.execute("SELECT effect FROM effects WHERE delivery_key = ?",
                               (delivery_key,)).fetchone()
        if found is None:
            return None
        order, effect = args["order"], found[0]
        ids = {"reserve": f"hold-{order}", "notice": f"notice-{order}"}
        return {"external_id": ids.get(effect, f"stamp-{order}-{args.get('n')}")}

    def stamped(self) -> list[str]:
        """The stamps done in the world (``stamp-<n>``), one entry per execution."""
        with self._db() as db:
            return [r[0] for r in db.execute("SELECT effect FROM effects WHERE effect LIKE 'stamp-%'")]


def _delivery(kind: str) -> Any:
    return lambda args, call: (ACCOUNT, kind, f"{args['order']}/{args.get('n', '')}", "1")


def parallel_app(root: Path, delays: Sequence[float] = (0.0,) * 5, stamps: tuple[int, int] = (1, 2)) -> App:
    """The application (workflow, tools, inputs) on the world under ``root``; ``stamps``: the two
    stamps the ``stamp`` stage gathers (other ones: a changed call set)."""
    world = ParallelWorld(root, delays)
    agent = Agent(FunctionModel(world.respond), name="par")
    for fn in (world.quote, world.reserve_stock, world.send_notice):
        agent.tool_plain(fn)
    reserve = tool(RESERVE_TOOL, policy=ReplayPolicy.RECONCILE_FIRST, target="sqlite:stock",
                   delivery=_delivery("stock"), reconcile=world.find)(world.reserve_stock)
    notice = tool(NOTICE_TOOL, policy=ReplayPolicy.RECONCILE_FIRST, target="sqlite:notices",
                  delivery=_delivery("notices"), reconcile=world.find)(world.send_notice)
    durable = RunlogAgent(agent, tools={"reserve_stock": reserve, "send_notice": notice})
    stamp = tool(STAMP_TOOL, policy=ReplayPolicy.RECONCILE_FIRST, target="sqlite:stamps",
                 delivery=_delivery("stamps"), reconcile=world.find)(world.stamp)

    wf = Workflow("parallel-shop", version="1")

    @wf.stage("fanout", rules=[rule("answered", lambda out: out["answer"].startswith("1200 hold-"))])
    async def fanout(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        result = await durable.run(ctx, f"price, hold and notify order {ctx.params['order']}")
        return {"answer": result.output}

    @wf.stage("stamp", rules=[rule("two stamps", lambda out: len(out["stamps"]) == 2)])
    async def stamp_both(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        order = ctx.params["order"]
        done = await asyncio.gather(*(ctx.call(stamp, order=order, n=n) for n in stamps))
        return {"stamps": [d["external_id"] for d in done]}

    return App.of([wf], [*durable.tools(), stamp], DictInputSource({}), name="parallel-shop")


def spawn(settings: Settings, root: Path, *, order: str, delays: Sequence[float], sdk: str = "sync",
          crash_at: str | None = None) -> Worker:
    """A worker process running one parallel-shop run (crashing at ``crash_at`` when given)."""
    return spawn_worker("tests.integration.resume._parallel_agent",
                        ["--dir", str(root), "--order", order, "--sdk", sdk,
                         "--delays", ",".join(str(d) for d in delays)], settings, crash_at=crash_at)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one parallel-shop workflow")
    p.add_argument("--dir", required=True)
    p.add_argument("--order", default="o-1")
    p.add_argument("--delays", default="0,0,0,0,0")
    p.add_argument("--sdk", default="sync", choices=["sync", "async"])
    a = p.parse_args(argv)
    arm_from_env()
    settings = Settings.from_env()
    app = parallel_app(Path(a.dir), [float(x) for x in a.delays.split(",")])
    wf = app.registry.get("parallel-shop")
    params = {"order": a.order}
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
