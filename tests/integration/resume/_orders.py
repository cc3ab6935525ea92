"""A second workflow that is not the demo: an order, with agent-like non-determinism.

Stages and tools (each tool backed by one of the demo world's services, so what
happened is counted in their own storage):

* ``pick``   an agent-like stage: it chooses a product variant with a random number
  (``random.random()`` when ``params.mode == "raw"``, ``ctx.random()`` when ``"ctx"``,
  a constant when ``"fixed"``), asks ``quote`` (SAFE; search service) with that
  choice, and reserves stock with ``reserve`` (IDEMPOTENT effect; assets service,
  deduplicated by idempotency key);
* ``pay``    reads the ``pricing`` input and charges the card with ``charge`` (NEVER;
  payments service, no idempotency at all);
* ``notify`` sends the confirmation with ``email`` (RECONCILE_FIRST; the platform
  service, which does not deduplicate but can be searched by delivery key).

The stages are ``async def`` (the sync Runner runs them on a private loop, the AsyncRunner on its
own); ``quote`` is an ``async def`` tool, the others are ``def`` tools.

Run as a worker process: ``python -m tests.integration.resume._orders --key K
[--mode ctx] [--order o-1] [--sdk async]`` prints ``run_id=<id>`` and executes one run (with
``RUNLOG_CRASH_AT`` it SIGKILLs itself at that point).
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from runlog.processors.demo.client import WorldClient
from runlog.processors.resume import App
from runlog.producers import (
    AsyncRunner,
    AsyncStageContext,
    CallInfo,
    DictInputSource,
    Runner,
    Tool,
    Workflow,
    rule,
    tool,
)
from runlog.producers.crash import arm_from_env
from runlog.schemas import ReplayPolicy, Settings
from tests.integration.resume._workers import Worker, spawn_worker

ACCOUNT = "acct-orders"
PRICING = {"v1": {"cents": 1200}, "v2": {"cents": 990}}


def orders_app(world: WorldClient, *, versions: Sequence[str] = ("1",),
               crash: Callable[[str, Mapping[str, Any]], None] | None = None) -> App:
    """The orders App registering ``versions`` of the workflow (``"1"``, ``"2"``: version 2 thanks the
    customer in its confirmation). ``crash(stage, params)``, when given, is called at the end of each
    stage (after its calls): raising a ``BaseException`` there abandons the run like a crash."""
    @tool("quote", policy=ReplayPolicy.SAFE)
    async def quote(call: CallInfo, sku: str, variant: float) -> Any:  # an async tool; the others are def
        found = await asyncio.to_thread(world.post, "/search", {"query": f"price {sku} {variant:.6f}"})
        return {"sku": sku, "variant": variant, "index_version": found["index_version"]}

    @tool("reserve", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="stock:reservations",
          delivery=lambda args, call: (ACCOUNT, "stock", f"{args['order']}:{args['sku']}", "1"))
    def reserve(call: CallInfo, order: str, sku: str, variant: float) -> Any:
        assert call.idempotency_key is not None
        rec = world.upload(call.idempotency_key, f"{order}|{sku}|{variant:.6f}".encode())
        return {"external_id": rec["asset_id"], "sku": sku}

    @tool("charge", policy=ReplayPolicy.NEVER, target="payments:cards",
          delivery=lambda args, call: (ACCOUNT, "payments", str(args["order"]), "1"))
    def charge(call: CallInfo, order: str, cents: int) -> Any:
        rec = world.post("/charges", {"account": ACCOUNT, "cents": cents, "reference": order})
        return {"external_id": rec["charge_id"]}

    def find_email(delivery_key: str, args: Mapping[str, Any]) -> Mapping[str, Any] | None:
        for art in world.get("/articles", delivery_key=delivery_key):
            return {"external_id": art["article_id"]}
        return None

    @tool("email", policy=ReplayPolicy.RECONCILE_FIRST, target="mail:confirmations",
          delivery=lambda args, call: (ACCOUNT, "mail", str(args["order"]), "confirmation"),
          reconcile=find_email)
    def email(call: CallInfo, order: str, text: str) -> Any:
        body = f"order {order}: {text}"
        rec = world.post("/articles", {"delivery_key": call.delivery_key, "title": f"order {order}",
                                       "body": body, "account": ACCOUNT,
                                       "content_hash": hashlib.sha256(body.encode()).hexdigest()})
        return {"external_id": rec["article_id"]}

    return App.of([_orders(v, quote, reserve, charge, email, crash) for v in versions],
                  [quote, reserve, charge, email],
                  DictInputSource({"pricing": PRICING}, latest={"pricing": "v1"}))


def _orders(version: str, quote: Tool, reserve: Tool, charge: Tool, email: Tool,
            crash: Callable[[str, Mapping[str, Any]], None] | None) -> Workflow:
    wf = Workflow("orders", version=version)

    def end(stage: str, ctx: AsyncStageContext) -> None:
        if crash is not None:
            crash(stage, ctx.params)

    @wf.stage("pick", rules=[rule("reserved", lambda out: bool(out["reservation"]))])
    async def pick(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        mode = ctx.params.get("mode", "ctx")
        roll = random.random() if mode == "raw" else await ctx.random() if mode == "ctx" else 0.25
        sku = "sku-red" if roll < 0.5 else "sku-blue"
        q = await ctx.call(quote, sku=sku, variant=roll)
        res = await ctx.call(reserve, order=ctx.params["order"], sku=q["sku"], variant=roll)
        end("pick", ctx)
        return {"sku": sku, "variant": roll, "reservation": res["external_id"]}

    @wf.stage("pay", inputs=["pricing"], rules=[rule("charged", lambda out: bool(out["charge_id"]))])
    async def pay(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        rec = await ctx.call(charge, order=ctx.params["order"], cents=inputs["pricing"]["cents"])
        end("pay", ctx)
        return {"charge_id": rec["external_id"]}

    if version == "1":
        @wf.stage("notify", rules=[rule("sent", lambda out: bool(out["email_id"]))])
        async def notify(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            text = f"charged {ctx.output_of('pay')['charge_id']}"
            rec = await ctx.call(email, order=ctx.params["order"], text=text)
            end("notify", ctx)
            return {"email_id": rec["external_id"]}
    else:  # version 2 changed the confirmation's text
        @wf.stage("notify", rules=[rule("sent", lambda out: bool(out["email_id"]))])
        async def notify_v2(ctx: AsyncStageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            text = f"thank you! charged {ctx.output_of('pay')['charge_id']}"
            rec = await ctx.call(email, order=ctx.params["order"], text=text)
            end("notify", ctx)
            return {"email_id": rec["external_id"]}

    return wf


def spawn(settings: Settings, world_url: str, *, key: str | None, order: str = "o-1", mode: str = "ctx",
          crash_at: str | None = None, sdk: str = "sync") -> Worker:
    """A worker process running one orders run (crashing at ``crash_at`` when given)."""
    args = ["--order", order, "--mode", mode, "--sdk", sdk] + ([] if key is None else ["--key", key])
    return spawn_worker("tests.integration.resume._orders", args, settings, crash_at=crash_at,
                        env={"RUNLOG_DEMO_WORLD_URL": world_url})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="run one orders workflow")
    p.add_argument("--key", default=None)
    p.add_argument("--order", default="o-1")
    p.add_argument("--mode", default="ctx", choices=["raw", "ctx", "fixed"])
    p.add_argument("--sdk", default="sync", choices=["sync", "async"])
    a = p.parse_args(argv)
    arm_from_env()
    settings = Settings.from_env()
    app = orders_app(WorldClient(settings.demo_world_url or ""))
    wf = app.registry.get("orders")
    params = {"order": a.order, "mode": a.mode}
    if a.sdk == "async":
        return asyncio.run(_main_async(settings, app, wf, params, a.key))
    with Runner.from_settings(settings, source=app.source) as runner:
        handle = runner.start_run(wf, params, idempotency_key=a.key)
        print(f"run_id={handle.run_id}", flush=True)
        print(f"created={json.dumps(handle.created)}", flush=True)
        if handle.session is None:
            return 0
        result = runner.execute(handle.session)
    print(f"completed={result.completed}", flush=True)
    return 0 if result.completed else 1


async def _main_async(settings: Settings, app: App, wf: Workflow, params: dict[str, Any],
                      key: str | None) -> int:
    async with AsyncRunner.from_settings(settings, source=app.source) as runner:
        handle = await runner.start_run(wf, params, idempotency_key=key)
        print(f"run_id={handle.run_id}", flush=True)
        print(f"created={json.dumps(handle.created)}", flush=True)
        if handle.session is None:
            return 0
        result = await runner.execute(handle.session)
    print(f"completed={result.completed}", flush=True)
    return 0 if result.completed else 1


if __name__ == "__main__":
    sys.exit(main())
