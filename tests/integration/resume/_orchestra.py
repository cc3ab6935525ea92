"""An orchestrator that fans out to child runs and gathers them, and its processes: ``python -m
tests.integration.resume._orchestra parent N`` starts one orchestrator run of N children and executes
it (prints ``run_id=...``); ``python -m tests.integration.resume._orchestra member NAME`` is one resumer
member of the App (prints ``assigned`` once its consumer holds partitions). Both arm ``RUNLOG_CRASH_AT``.

Each child publishes once: ``publish`` is a ``RECONCILE_FIRST`` effect that counts its executions per
item in Redis (``<prefix>:test:published:<item>``) and is found again by its delivery key."""

from __future__ import annotations

import sys
from typing import Any

import redis

from runlog.processors.resume import App, ResumerService
from runlog.producers import CallInfo, DictInputSource, Runner, StageContext, Workflow, tool
from runlog.producers.crash import arm_from_env
from runlog.schemas import ReplayPolicy, Settings

_R: dict[str, Any] = {}


def _redis() -> tuple[redis.Redis, str]:
    if "r" not in _R:
        s = Settings.from_env()
        _R["r"], _R["p"] = redis.Redis.from_url(s.redis_url), s.redis_prefix
    return _R["r"], _R["p"]


def _reconcile(key: str, args: dict[str, Any]) -> dict[str, Any] | None:
    r, p = _redis()
    return {"external_id": key} if r.exists(f"{p}:test:done:{key}") else None


@tool("publish", policy=ReplayPolicy.RECONCILE_FIRST, target="test:outbox",
      delivery=lambda args, call: ("test", "outbox", str(args["item"]), "1"), reconcile=_reconcile)
def publish(call: CallInfo, item: int) -> dict[str, Any]:
    r, p = _redis()
    r.incr(f"{p}:test:published:{item}")
    assert call.delivery_key is not None
    r.set(f"{p}:test:done:{call.delivery_key}", "1")
    return {"external_id": call.delivery_key}


def item_workflow() -> Workflow:
    wf = Workflow("item", version="1")

    @wf.stage("work")
    def work(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        out = ctx.call(publish, item=ctx.params["item"])
        n = ctx.params["item"]
        return {"item": n, "square": n ** 2, "external_id": out["external_id"]}

    return wf


def orchestrator() -> Workflow:
    wf = Workflow("orchestrator", version="1")
    item = item_workflow()

    @wf.stage("fan")
    def fan(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        handles = [ctx.start_child(item, {"item": i}, key=f"item-{i}") for i in range(ctx.params["count"])]
        return {"outputs": [r.outputs["work"] for r in ctx.gather(*handles)]}

    return wf


def app() -> App:
    return App.of([orchestrator(), item_workflow()], [publish], DictInputSource({}))


def main(argv: list[str]) -> int:
    arm_from_env()  # RUNLOG_CRASH_AT
    settings = Settings.from_env()
    if argv[0] == "parent":
        with Runner.from_settings(settings) as runner:
            handle = runner.start_run(orchestrator(), {"count": int(argv[1])})
            print(f"run_id={handle.run_id}", flush=True)
            assert handle.session is not None
            result = runner.execute(handle.session)
            print(f"waiting={result.waiting}", flush=True)
        return 0
    with ResumerService(settings, app()) as member:
        while not member.partitions:
            member.poll_once(0.2)
        print("assigned", flush=True)
        member.serve()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
