"""A workflow that both the current Runlog and an older release (built from git history) can run:
the mixed-version test's App. It imports Runlog under the root ``UPGRADE_IMPORT_ROOT`` names
(``runlog.`` for the current code, empty for a release from before the single ``runlog`` import
root), and nothing of the tests, so a process of the older release can load it from a directory of
its own (``--app mixed_app:app``).

Stages: ``gather`` (a SAFE lookup; on the current code it reports usage, which a writer pinned below
schema version 5 carries in the event's attributes), ``render`` (an IDEMPOTENT effect: the effects
ledger and the effects topic), ``finish`` (a SAFE call, then a crash while :data:`CRASH` is set: a
writer process sets it, so its runs stop there and a resumer of the other release continues them).
"""

from __future__ import annotations

import importlib
import os
from typing import Any

ROOT = os.environ.get("UPGRADE_IMPORT_ROOT", "runlog.")
_p = importlib.import_module(ROOT + "producers")
_resume = importlib.import_module(ROOT + "processors.resume")

CRASH = False
"""True in a writer process: every run stops in ``finish`` as if its process died there."""


class Abandon(BaseException):
    """Stops a run in the middle of a stage like a crash: nothing more is appended."""


def _usage(result: Any) -> Any:
    return _p.Usage(model="test:model", input_tokens=int(result["n"]), output_tokens=1)


_lookup_options: dict[str, Any] = {"usage": _usage} if hasattr(_p, "Usage") else {}


@_p.tool("upg_lookup", **_lookup_options)
def lookup(call: Any, q: str) -> dict[str, Any]:
    return {"answer": f"answer:{q}", "n": len(q)}


@_p.tool("upg_render", policy=_p.ReplayPolicy.IDEMPOTENT, effect=True, target="renderer",
         delivery=lambda args, call: ("acct", "renderer", args["text"], "1"))
def render(call: Any, text: str) -> dict[str, Any]:
    return {"text": text.upper(), "external_id": f"render-{text}"}


@_p.tool("upg_sign")
def sign(call: Any, text: str) -> dict[str, Any]:
    return {"signed": f"{text}/ok"}


workflow = _p.Workflow("upgrade_mixed", "1")


@workflow.stage("gather", rules=[_p.rule("answer.set", lambda o: bool(o.get("answer")))])
def gather(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"answer": ctx.call(lookup, q=ctx.params["q"])["answer"]}


@workflow.stage("render", rules=[_p.rule("text.upper", lambda o: o.get("text", "").isupper())])
def render_stage(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    return {"text": ctx.call(render, text=ctx.output_of("gather")["answer"])["text"]}


@workflow.stage("finish", rules=[_p.rule("signed", lambda o: o.get("signed", "").endswith("/ok"))])
def finish(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
    out = ctx.call(sign, text=ctx.output_of("render")["text"])
    if CRASH:
        raise Abandon("crashed in finish")
    return {"signed": out["signed"]}


app = _resume.App.of([workflow], [lookup, render, sign], _p.DictInputSource({}), name="upgrade-mixed")
