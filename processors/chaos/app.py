"""The chaos workload's application: the demo's content and checkout workflows, and ``ledger``, a
workflow that calls a tool of every replay policy and waits for a signal between its stages.

``ledger`` (against the same demo world): ``prepare`` searches (``SAFE``), renders (``IDEMPOTENT``) and
uploads (``IDEMPOTENT`` with an effect); ``approve`` waits for the ``approval`` signal; ``settle``
publishes (``RECONCILE_FIRST``) and charges a card (``NEVER``: a crash between its intent and result
blocks the run in doubt, which a person resolves).

``app()`` is what ``runlog resumer --app runlog.processors.chaos.app:app`` loads (the world at
``RUNLOG_DEMO_WORLD_URL``).
"""

from __future__ import annotations

from hashlib import sha256
from typing import Any

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.pipeline import build, charge_workflow, source
from runlog.producers import App, StageContext, Tool, Workflow, rule
from runlog.schemas import Settings

__all__ = ["APPROVAL", "WORKFLOWS", "app", "app_for", "ledger_workflow"]

APPROVAL = "approval"
"""The signal ``ledger`` waits for."""

WORKFLOWS = ("content", "checkout", "ledger")


def ledger_workflow(tools: list[Tool], charge: Tool) -> Workflow:
    """The workflow with a tool of every replay policy and a wait (see the module's docstring), on the
    demo's tools (``search``, ``render``, ``upload``, ``publish``) and its ``charge``."""
    search, render, upload, publish = tools
    wf = Workflow("ledger", version="1")

    @wf.stage("prepare", rules=[rule("asset.uploaded", lambda out: bool(out["asset_id"]))])
    def prepare(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        name = str(ctx.params["name"])
        found = ctx.call(search, query=f"ledger {name}")
        img = ctx.call(render, prompt=f"ledger {name}", seed=int(ctx.params.get("seed", 3)))
        up = ctx.call(upload, name=f"ledger-{name}", sha256=img["sha256"], image_hex=img["image_hex"])
        return {"asset_id": up["external_id"], "sha256": img["sha256"],
                "source": found["results"][0]["title"]}

    @wf.stage("approve", rules=[rule("approved", lambda out: out["approved"] is True)])
    def approve(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        data = ctx.wait_for(APPROVAL)
        return {"approved": bool(data.get("approved")) if isinstance(data, dict) else False}

    @wf.stage("settle",
              rules=[rule("settled", lambda out: bool(out["article_id"]) and bool(out["charge_id"]))])
    def settle(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        name = str(ctx.params["name"])
        prep = ctx.output_of("prepare")
        title = f"Ledger {name}"
        body = f"{title}: asset {prep['asset_id']} from {prep['source']}. " * 3
        digest = sha256((title + body).encode()).hexdigest()
        art = ctx.call(publish, draft_id=f"ledger-{name}", revision=digest[:12], title=title, body=body,
                       content_hash=digest, assets=[prep["asset_id"]])
        paid = ctx.call(charge, order=f"ledger-{name}", cents=int(ctx.params.get("cents", 250)))
        return {"article_id": art["external_id"], "charge_id": paid["external_id"]}

    return wf


def app_for(world: WorldClient) -> App:
    """The chaos application (content, checkout, ledger) bound to one demo world."""
    content, tools = build(world)
    checkout, charge = charge_workflow(world)
    return App.of([content, checkout, ledger_workflow(tools, charge)], [*tools, charge], source())


def app() -> App:
    """The chaos application, bound to the world at ``RUNLOG_DEMO_WORLD_URL``."""
    return app_for(WorldClient(Settings.from_env().demo_world_url or ""))
