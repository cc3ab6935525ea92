"""The shop a durable agent runs in the crash matrix (tests/integration/resume/test_agent_crash.py),
whatever its framework: the world's files, the model's script, the tools, and the worker process.

Workflow (two ``async def`` stages, one agent spanning both):

* ``research``: the agent looks the price up (model -> ``lookup``, a SAFE tool -> model) and
  passes its conversation on;
* ``order``: the agent continues the conversation and saves the order (model -> ``save_order``,
  a ``RECONCILE_FIRST`` effect that inserts a row into a local SQLite file whose delivery-key
  column is unique -> model).

The model follows :meth:`ShopWorld.respond` (no network) and reports ``500 + 100 * turn`` input
tokens and 20 output tokens a request, priced by :data:`PRICE`. What really happened is counted in
files under the world directory: ``model.log`` (one line per model request: its turn),
``lookup.log`` (one line per lookup), ``attempts.log`` (one line per entry into the effect), and the
rows of ``orders.db``.

Each integration's module (``_openai_agents_agent``, ``_pydantic_ai_agent``) builds the agent and the
workflow on its framework and describes itself as a :class:`Shop`; run as a worker, ``python -m
<module> --dir D [--order o-1] [--sdk sync|async]`` prints ``run_id=<id>`` and executes one run (with
``RUNLOG_CRASH_AT`` it SIGKILLs itself at that point).
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from runlog.processors.resume import App
from runlog.producers import AsyncRunner, CallInfo, Price, Runner
from runlog.producers.crash import arm_from_env
from runlog.schemas import Settings
from tests.integration.resume._workers import Worker, spawn_worker

ACCOUNT = "acct-agent"
INSTRUCTIONS = "Look prices up, then save the order."
PRICE = Price(input=2, output=8)
"""What a model request costs, in $ per million tokens."""


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

    def respond(self, turn: int, prompt: str, returns: Mapping[str, Any]) -> tuple[str, dict[str, Any]] | str:
        """The model's answer at ``turn`` (its latest prompt, the tools' results by tool name): a tool
        call ``(tool, arguments)`` or a text. Look the price up; when only asked to look, answer;
        else save the order, then answer."""
        self._line("model.log", str(turn))
        if "lookup" not in returns:
            return "lookup", {"sku": prompt.split()[-1]}
        price = returns["lookup"]["price"]
        if prompt.startswith("look up"):
            return f"the price is {price}"
        if "save_order" not in returns:
            return "save_order", {"order": prompt.split()[-1], "price": price}
        return f"saved {returns['save_order']['external_id']}"

    @staticmethod
    def tokens(turn: int) -> tuple[int, int]:
        """What the model's request at ``turn`` spent: (input tokens, output tokens)."""
        return 500 + 100 * turn, 20

    def lookup(self, sku: str) -> dict[str, Any]:
        self._line("lookup.log", sku)
        return {"sku": sku, "price": 1200}

    def save_order(self, call: CallInfo, order: str, price: int) -> dict[str, Any]:
        """The effect, made in the recorded ``call``."""
        self._line("attempts.log", call.call_id)
        with self._db() as db:  # a second insert for one delivery key raises: never silently twice
            db.execute("INSERT INTO rows VALUES (?, ?, ?, ?)", (call.delivery_key, order, price, call.epoch))
        return {"external_id": f"row-{order}"}

    def find_row(self, delivery_key: str, args: Mapping[str, Any]) -> Mapping[str, Any] | None:
        with self._db() as db:
            found = db.execute("SELECT order_id FROM rows WHERE delivery_key = ?", (delivery_key,)).fetchone()
        return {"external_id": f"row-{found[0]}"} if found else None


def delivery(args: Mapping[str, Any], call: CallInfo) -> tuple[str, str, str, str]:
    """The save's delivery key parts: one row per order."""
    return ACCOUNT, "sqlite", str(args["order"]), "1"


@dataclass(frozen=True)
class Shop:
    """One integration's shop: the Runlog tools its calls are recorded as, and its application."""

    integration: str
    workflow: str
    module: str
    """The worker's module (``python -m``)."""
    model_tool: str
    lookup_tool: str
    save_tool: str
    app: Callable[..., App]
    """``app(root, *, instructions=INSTRUCTIONS)``: the application on the world under ``root``
    (other ``instructions``: another version of the code, whose model requests diverge)."""

    def spawn(self, settings: Settings, root: Path, *, order: str = "o-1", sdk: str = "sync",
              crash_at: str | None = None) -> Worker:
        """A worker process running one run (crashing at ``crash_at`` when given)."""
        return spawn_worker(self.module, ["--dir", str(root), "--order", order, "--sdk", sdk], settings,
                            crash_at=crash_at)

    def main(self, argv: list[str] | None = None) -> int:
        """The worker: one run of the workflow, the sync or the async runner."""
        p = argparse.ArgumentParser(description=f"run one {self.workflow} workflow")
        p.add_argument("--dir", required=True)
        p.add_argument("--order", default="o-1")
        p.add_argument("--sdk", default="sync", choices=["sync", "async"])
        a = p.parse_args(argv)
        arm_from_env()
        settings = Settings.from_env()
        app = self.app(Path(a.dir))
        wf = app.registry.get(self.workflow)
        params = {"order": a.order, "sku": "sku-1"}
        if a.sdk == "async":
            async def go() -> bool:
                async with AsyncRunner.from_settings(settings, source=app.source,
                                                     prices=app.prices) as runner:
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
