"""Synthetic, valid run logs as the run writer would append them (for fold and projector tests)."""

from __future__ import annotations

import hashlib
from dataclasses import replace
from typing import Any

from runlog.schemas import (
    ArtifactRef,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    RuleResult,
    RunEvent,
    StageSpec,
    WorkflowSpec,
)

STAGES = ("research", "verify", "draft", "visual", "prefill", "publish")
WORKFLOW = WorkflowSpec(
    "article",
    "3",
    tuple(StageSpec(n, inputs=("facts",) if n == "verify" else (), rules=(f"{n}.ok",)) for n in STAGES),
)
T0 = 1_700_000_000_000


def art(name: str) -> ArtifactRef:
    h = hashlib.sha256(name.encode()).hexdigest()
    return ArtifactRef(f"file:///artifacts/{h}", h, len(name), "application/json")


class RunBuilder:
    """Appends events of one run with gapless seqs, like a run writer holding the lease."""

    def __init__(self, run_id: str, epoch: int = 1) -> None:
        self.run_id = run_id
        self.epoch = epoch
        self.events: list[RunEvent] = []

    @property
    def seq(self) -> int:
        return len(self.events)

    def add(self, type_: EventType, **kw: Any) -> RunEvent:
        ev = RunEvent(
            run_id=self.run_id, seq=self.seq + 1, epoch=self.epoch, type=type_,
            occurred_at=T0 + self.seq * 10, **kw,
        )
        self.events.append(ev)
        return ev

    def start(self, workflow: WorkflowSpec = WORKFLOW) -> RunBuilder:
        self.add(EventType.RUN_STARTED, workflow=workflow, input_versions={"facts": "v1", "seed": "7"})
        return self

    def lease(self, epoch: int) -> RunBuilder:
        self.epoch = epoch
        self.add(EventType.LEASE_ACQUIRED)
        return self

    def call(self, stage: str, n: int, *, effect: bool = False, result: bool = True) -> str:
        cid = f"{self.run_id}/{stage}/{n}"
        pol = ReplayPolicy.RECONCILE_FIRST if effect else ReplayPolicy.SAFE
        self.add(EventType.TOOL_CALLED, stage=stage, call_id=cid, tool=f"tool.{stage}",
                 replay_policy=pol, idempotency_key=f"idem-{cid}", payload_ref=art(f"args-{cid}"),
                 request_hash=f"rh-{cid}")
        if effect:
            dk = f"dk-{cid}"
            self.add(EventType.EFFECT_INTENT, stage=stage, call_id=cid, delivery_key=dk,
                     target=f"cms:{stage}", request_hash=f"rh-{cid}", tool=f"tool.{stage}",
                     replay_policy=pol)
            if not result:
                return cid
            self.add(EventType.EFFECT_RESULT, stage=stage, call_id=cid, delivery_key=dk,
                     external_id=f"ext-{cid}")
        if result:
            self.add(EventType.TOOL_RESULT, stage=stage, call_id=cid, payload_ref=art(f"result-{cid}"))
        return cid

    def stage(self, stage: str, calls: int = 2, *, effect: bool = False, verify: bool = True) -> RunBuilder:
        self.add(EventType.STAGE_STARTED, stage=stage)
        for i in range(calls):
            self.call(stage, i, effect=effect and i == calls - 1)
        if verify:
            self.add(EventType.VERIFIED, stage=stage, payload_ref=art(f"out-{self.run_id}-{stage}"),
                     artifact_refs=(art(f"a-{self.run_id}-{stage}"),),
                     verification=(RuleResult(f"{stage}.ok", True),))
        return self

    def fail(self, stage: str) -> RunBuilder:
        self.add(EventType.FAILED, stage=stage, error=ErrorInfo("tool", "boom", True))
        return self

    def complete(self) -> RunBuilder:
        self.add(EventType.RUN_COMPLETED)
        return self


def full_run(run_id: str, stages: int = len(STAGES), calls: int = 2) -> list[RunEvent]:
    b = RunBuilder(run_id).start()
    for s in STAGES[:stages]:
        b.stage(s, calls, effect=s in ("visual", "publish"))
    if stages == len(STAGES):
        b.complete()
    return b.events


def zombie(ev: RunEvent, epoch: int, seq: int) -> RunEvent:
    """An event a writer whose lease expired would still append."""
    return replace(ev, epoch=epoch, seq=seq, occurred_at=ev.occurred_at + 1)
