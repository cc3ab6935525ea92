"""The workflow of the failover stream test (``test_failover_stream.py``): an order is reserved, packed
and shipped, each effect counted by the demo world's services in their own SQLite files.

* ``reserve`` (IDEMPOTENT effect, the ``assets`` service): stores ``reservation <order>`` under the
  call's idempotency key. The key is derived from the run id, so a second *run* of the same order
  that executed the call would store a second asset with the same content: the assets table counts
  the reservations per order.
* ``ship`` (RECONCILE_FIRST, the ``platform`` service, which does not deduplicate): publishes one
  label per call, findable by delivery key (what the reconcile asks). The articles table counts the
  labels per order.

Both delivery keys name the order only, so a second run of an order must be told by the effects
ledger that its effects are done (``EFFECT_RECONCILED``), not execute them again.

``app()`` is what the test's ``runlog resumer --app tests.integration.cluster._stream:app`` loads
(the world from ``RUNLOG_DEMO_WORLD_URL``).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import Any

from runlog.processors.demo.client import WorldClient
from runlog.producers import App, CallInfo, DictInputSource, ReplayPolicy, StageContext, Workflow, rule, tool
from runlog.schemas import Settings

ACCOUNT = "acct-stream"
WORKFLOW = "shipment"


def reservation(order: str) -> bytes:
    """What ``reserve`` stores for an order (its sha256 names the order in the assets table)."""
    return f"reservation {order}".encode()


def stream_app(world: WorldClient) -> App:
    @tool("reserve", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="stock:reservations",
          delivery=lambda args, call: (ACCOUNT, "stock", str(args["order"]), "1"))
    def reserve(call: CallInfo, order: str) -> Any:
        assert call.idempotency_key is not None
        rec = world.upload(call.idempotency_key, reservation(order))
        return {"external_id": rec["asset_id"]}

    def find_label(delivery_key: str, args: Mapping[str, Any]) -> Mapping[str, Any] | None:
        for art in world.get("/articles", delivery_key=delivery_key):
            return {"external_id": art["article_id"]}
        return None

    @tool("ship", policy=ReplayPolicy.RECONCILE_FIRST, target="shipping:labels",
          delivery=lambda args, call: (ACCOUNT, "shipping", str(args["order"]), "1"), reconcile=find_label)
    def ship(call: CallInfo, order: str) -> Any:
        body = f"label for {order}"
        rec = world.post("/articles", {"delivery_key": call.delivery_key, "title": f"order {order}",
                                       "body": body, "account": ACCOUNT, "fencing_epoch": call.epoch,
                                       "content_hash": hashlib.sha256(body.encode()).hexdigest()})
        return {"external_id": rec["article_id"]}

    wf = Workflow(WORKFLOW, version="1")

    @wf.stage("reserve", rules=[rule("reserved", lambda out: bool(out["reservation"]))])
    def reserve_stage(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        time.sleep(float(ctx.params.get("pause", 0.0)))
        return {"reservation": ctx.call(reserve, order=ctx.params["order"])["external_id"]}

    @wf.stage("pack")
    def pack(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        time.sleep(float(ctx.params.get("pause", 0.0)))  # the run is in flight, holding its lease
        return {"packed": ctx.output_of("reserve")["reservation"]}

    @wf.stage("ship", rules=[rule("shipped", lambda out: bool(out["label"]))])
    def ship_stage(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        time.sleep(float(ctx.params.get("pause", 0.0)) / 2)
        return {"label": ctx.call(ship, order=ctx.params["order"])["external_id"]}

    return App.of([wf], [reserve, ship], DictInputSource({}))


def app() -> App:
    """The stream's application, bound to the world at ``RUNLOG_DEMO_WORLD_URL``."""
    return stream_app(WorldClient(Settings.from_env().demo_world_url or ""))
