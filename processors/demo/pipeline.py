"""The seed's content pipeline: research -> verify -> draft -> visual -> prefill -> publish.

Tools talk to the demo world (:mod:`runlog.processors.demo.world`) and carry the
replay policies the seed gives them: search and drafting are ``SAFE``,
rendering and uploading are ``IDEMPOTENT``, publishing is ``RECONCILE_FIRST``
(the platform is asked by delivery key before a second publish), and charging
a card is ``NEVER``.

``app()`` is what ``runlog resumer --app runlog.processors.demo.pipeline:app`` loads.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import Any

from runlog.processors.demo.client import WorldClient
from runlog.producers import (
    App,
    CallInfo,
    DictInputSource,
    ReplayPolicy,
    StageContext,
    Tool,
    Workflow,
    rule,
    tool,
)
from runlog.schemas import Settings

__all__ = ["FACTS", "app", "app_for", "build", "charge_workflow", "source"]


FACTS: dict[str, dict[str, Any]] = {
    "v3": {"claims": [
        {"id": "c1", "text": "event logs are append-only", "true": True},
        {"id": "c2", "text": "checkpoints follow verification", "true": True},
        {"id": "c3", "text": "retries must reconcile side effects", "true": True},
    ]},
    "v4": {"claims": [
        {"id": "c1", "text": "event logs are append-only", "true": True},
        {"id": "c2", "text": "checkpoints follow verification", "true": True},
        {"id": "c3", "text": "retries must reconcile side effects", "true": True},
        {"id": "c4", "text": "inputs are pinned per run", "true": True},
    ]},
}
BRIEFS: dict[str, dict[str, Any]] = {
    "v1": {"topic": "resumable agent workflows", "images": ["body-1", "body-2", "cover"]},
}


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def build(world: WorldClient, *, version: str = "1") -> tuple[Workflow, list[Tool]]:
    """The content workflow and its tools, bound to one demo world (``version``: the workflow's)."""

    @tool("search", policy=ReplayPolicy.SAFE)
    def search(call: CallInfo, query: str) -> Any:
        return world.post("/search", {"query": query})

    @tool("render", policy=ReplayPolicy.IDEMPOTENT)
    def render(call: CallInfo, prompt: str, seed: int) -> Any:
        return world.post("/render", {"prompt": prompt, "seed": seed,
                                      "idempotency_key": call.idempotency_key})

    @tool("upload", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="assets:images",
          delivery=lambda args, call: (world.account(), "demo-assets", str(args["name"]),
                                       str(args["sha256"])))
    def upload(call: CallInfo, name: str, sha256: str, image_hex: str) -> Any:
        assert call.idempotency_key is not None
        rec = world.upload(call.idempotency_key, bytes.fromhex(image_hex))
        return {"external_id": rec["asset_id"], "name": name, "sha256": rec["sha256"]}

    def find_article(delivery_key: str, args: Mapping[str, Any]) -> Mapping[str, Any] | None:
        for art in world.get("/articles", delivery_key=delivery_key):
            if art["content_hash"] == args["content_hash"]:
                return {"external_id": art["article_id"], "content_hash": art["content_hash"],
                        "title": art["title"]}
        return None

    @tool("publish", policy=ReplayPolicy.RECONCILE_FIRST, target="platform:articles",
          delivery=lambda args, call: (world.account(), "demo-platform", str(args["draft_id"]),
                                       str(args["revision"])),
          reconcile=find_article)
    def publish(call: CallInfo, draft_id: str, revision: str, title: str, body: str,
                content_hash: str, assets: list[str]) -> Any:
        rec = world.post("/articles", {"delivery_key": call.delivery_key, "title": title,
                                       "body": body, "content_hash": content_hash,
                                       "account": world.account(), "fencing_epoch": call.epoch})
        return {"external_id": rec["article_id"], "url": rec["url"], "content_hash": content_hash,
                "title": title}

    wf = Workflow("content", version=version)

    @wf.stage("research", inputs=["brief"],
              rules=[rule("sources.count >= 3", lambda out: len(out["sources"]) >= 3)])
    def research(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        found = ctx.call(search, query=inputs["brief"]["topic"])
        return {"topic": inputs["brief"]["topic"], "sources": found["results"][:3],
                "index_version": found["index_version"]}

    @wf.stage("verify", inputs=["facts"],
              rules=[rule("facts.all_true", lambda out: all(c["true"] for c in out["claims"]))])
    def verify(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        sources = ctx.output_of("research")["sources"]
        claims = [dict(c, cited=sources[i % len(sources)]["title"])
                  for i, c in enumerate(inputs["facts"]["claims"])]
        return {"claims": claims}

    @wf.stage("draft", rules=[rule("draft.words >= 30", lambda out: len(out["body"].split()) >= 30)])
    def draft(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        topic = ctx.output_of("research")["topic"]
        claims = ctx.output_of("verify")["claims"]
        body = " ".join(f"{c['text'].capitalize()} ({c['cited']})." for c in claims) * 3
        title = f"On {topic}"
        # The revision names the content: a branch with new facts publishes a new revision (a new
        # delivery key); a resume that drafts the same text again publishes the same one.
        return {"draft_id": f"draft-{_sha(title)[:10]}", "revision": _sha(title + body)[:12], "title": title,
                "body": body}

    @wf.stage("visual", inputs=["brief"],
              rules=[rule("image.count == 3", lambda out: len(out["images"]) == 3),
                     rule("image.watermark == false",
                          lambda out: not any(i["watermark"] for i in out["images"]))])
    def visual(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        title = ctx.output_of("draft")["title"]
        images = []
        for name in inputs["brief"]["images"]:
            img = ctx.call(render, prompt=f"{title} / {name}", seed=int(ctx.params.get("seed", 7)))
            ctx.put_artifact(bytes.fromhex(img["image_hex"]), "image/png")
            up = ctx.call(upload, name=name, sha256=img["sha256"], image_hex=img["image_hex"])
            images.append({"name": name, "sha256": img["sha256"], "asset_id": up["external_id"],
                           "watermark": img["watermark"]})
        return {"images": images}

    @wf.stage("prefill", checkpoint=False,
              rules=[rule("form.complete", lambda out: bool(out["tags"]) and bool(out["summary"]))])
    def prefill(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        d = ctx.output_of("draft")
        return {"tags": ["agents", "kafka", "resume"], "summary": d["body"][:120]}

    @wf.stage("publish", rules=[rule("article.published", lambda out: bool(out["article_id"]))])
    def publish_stage(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        d = ctx.output_of("draft")
        assets = [i["asset_id"] for i in ctx.output_of("visual")["images"]]
        body = d["body"] + "\n\n" + ctx.output_of("prefill")["summary"]
        rec = ctx.call(publish, draft_id=d["draft_id"], revision=d["revision"], title=d["title"],
                       body=body, content_hash=_sha(d["title"] + body), assets=assets)
        return {"article_id": rec["external_id"], "content_hash": rec["content_hash"]}

    return wf, [search, render, upload, publish]


def charge_workflow(world: WorldClient) -> tuple[Workflow, Tool]:
    """A two-stage workflow whose second stage charges a card (a ``NEVER`` tool)."""

    @tool("charge", policy=ReplayPolicy.NEVER, target="payments:cards",
          delivery=lambda args, call: (world.account(), "demo-payments", str(args["order"]), "1"))
    def charge(call: CallInfo, order: str, cents: int) -> Any:
        rec = world.post("/charges", {"account": world.account(), "cents": cents, "reference": order})
        return {"external_id": rec["charge_id"]}

    wf = Workflow("checkout", version="1")

    @wf.stage("quote", rules=[rule("quote.positive", lambda out: out["cents"] > 0)])
    def quote(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"cents": int(ctx.params.get("cents", 500))}

    @wf.stage("pay", rules=[rule("charge.recorded", lambda out: bool(out["charge_id"]))])
    def pay(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        rec = ctx.call(charge, order=str(ctx.params.get("order", "o-1")),
                       cents=ctx.output_of("quote")["cents"])
        return {"charge_id": rec["external_id"]}

    return wf, charge


def source() -> DictInputSource:
    """The demo's versioned inputs: the brief and the fact table (v3 is pinned by default)."""
    return DictInputSource({"brief": BRIEFS, "facts": FACTS}, latest={"facts": "v3", "brief": "v1"})


def app_for(world: WorldClient, *, version: str = "1") -> App:
    """The demo application (content and checkout workflows) bound to one demo world."""
    wf, tools = build(world, version=version)
    checkout, charge = charge_workflow(world)
    return App.of([wf, checkout], [*tools, charge], source())


def app() -> App:
    """The demo application, bound to the world at ``RUNLOG_DEMO_WORLD_URL``.

    Without it the app can still plan (``runlog resume --dry-run``); its tools then
    fail with a clear error when called.
    """
    return app_for(WorldClient(Settings.from_env().demo_world_url or ""))
