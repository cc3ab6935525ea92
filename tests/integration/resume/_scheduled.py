"""A workflow a schedule starts (``beat``): one SAFE call."""

from __future__ import annotations

from typing import Any

from runlog.processors.resume import App
from runlog.producers import CallInfo, DictInputSource, StageContext, Workflow, tool
from runlog.schemas import ReplayPolicy


@tool("count", policy=ReplayPolicy.SAFE)
def count(call: CallInfo, k: int) -> dict[str, Any]:
    return {"run_id": call.run_id, "k": k}


def _workflow() -> Workflow:
    wf = Workflow("beat", version="1")

    @wf.stage("once")
    def once(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return ctx.call(count, k=int(ctx.params.get("k", 0)))  # type: ignore[no-any-return]

    return wf


app = App.of([_workflow()], [count], DictInputSource({}), name="beats")
