"""Runlog's Python record types to the dicts fastavro writes, and back: one pair of functions per
record (``RunEvent``, ``Checkpoint``, ``Effect``, ``ResumeRequest``) and the shared types inside
them, gathered by Python type in :data:`KINDS` with each record's Avro full name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from schemas._types import (
    ArtifactRef,
    Checkpoint,
    Effect,
    EffectStatus,
    ErrorInfo,
    EventType,
    ReplayPolicy,
    ResumeRequest,
    RuleResult,
    RunEvent,
    StageSpec,
    WorkflowSpec,
)

__all__ = ["KINDS", "Kind"]


def _artifact_to(a: ArtifactRef) -> dict[str, Any]:
    return {"uri": a.uri, "sha256": a.sha256, "size": a.size, "media_type": a.media_type}


def _artifact_from(d: dict[str, Any]) -> ArtifactRef:
    return ArtifactRef(d["uri"], d["sha256"], d["size"], d["media_type"])


def _rule_to(r: RuleResult) -> dict[str, Any]:
    return {"rule": r.rule, "passed": r.passed, "detail": r.detail}


def _rule_from(d: dict[str, Any]) -> RuleResult:
    return RuleResult(d["rule"], d["passed"], d["detail"])


def _workflow_to(w: WorkflowSpec) -> dict[str, Any]:
    return {
        "name": w.name,
        "version": w.version,
        "stages": [
            {"name": s.name, "inputs": list(s.inputs), "rules": list(s.rules),
             "checkpoint": s.checkpoint}
            for s in w.stages
        ],
    }


def _workflow_from(d: dict[str, Any]) -> WorkflowSpec:
    return WorkflowSpec(
        d["name"],
        d["version"],
        tuple(
            StageSpec(s["name"], tuple(s["inputs"]), tuple(s["rules"]), s["checkpoint"])
            for s in d["stages"]
        ),
    )


def _event_to(e: RunEvent) -> dict[str, Any]:
    return {
        "run_id": e.run_id,
        "seq": e.seq,
        "epoch": e.epoch,
        "type": e.type.value,
        "occurred_at": e.occurred_at,
        "stage": e.stage,
        "workflow": None if e.workflow is None else _workflow_to(e.workflow),
        "input_versions": dict(e.input_versions),
        "payload_ref": None if e.payload_ref is None else _artifact_to(e.payload_ref),
        "artifact_refs": [_artifact_to(a) for a in e.artifact_refs],
        "tool": e.tool,
        "call_id": e.call_id,
        "replay_policy": None if e.replay_policy is None else e.replay_policy.value,
        "idempotency_key": e.idempotency_key,
        "delivery_key": e.delivery_key,
        "target": e.target,
        "request_hash": e.request_hash,
        "external_id": e.external_id,
        "verification": [_rule_to(r) for r in e.verification],
        "error": None
        if e.error is None
        else {"kind": e.error.kind, "message": e.error.message, "retryable": e.error.retryable},
        "parent_run_id": e.parent_run_id,
        "forked_from_seq": e.forked_from_seq,
        "attributes": dict(e.attributes),
        "prev_hash": e.prev_hash,
    }


def _event_from(d: dict[str, Any]) -> RunEvent:
    err = d["error"]
    pol = d["replay_policy"]
    return RunEvent(
        run_id=d["run_id"],
        seq=d["seq"],
        epoch=d["epoch"],
        type=EventType(d["type"]),
        occurred_at=d["occurred_at"],
        stage=d["stage"],
        workflow=None if d["workflow"] is None else _workflow_from(d["workflow"]),
        input_versions=d["input_versions"],
        payload_ref=None if d["payload_ref"] is None else _artifact_from(d["payload_ref"]),
        artifact_refs=tuple(_artifact_from(a) for a in d["artifact_refs"]),
        tool=d["tool"],
        call_id=d["call_id"],
        replay_policy=None if pol is None else ReplayPolicy(pol),
        idempotency_key=d["idempotency_key"],
        delivery_key=d["delivery_key"],
        target=d["target"],
        request_hash=d["request_hash"],
        external_id=d["external_id"],
        verification=tuple(_rule_from(r) for r in d["verification"]),
        error=None if err is None else ErrorInfo(err["kind"], err["message"], err["retryable"]),
        parent_run_id=d["parent_run_id"],
        forked_from_seq=d["forked_from_seq"],
        attributes=d["attributes"],
        prev_hash=d.get("prev_hash"),
    )


def _checkpoint_to(c: Checkpoint) -> dict[str, Any]:
    return {
        "checkpoint_id": c.checkpoint_id,
        "run_id": c.run_id,
        "last_seq": c.last_seq,
        "partition": c.partition,
        "offset": c.offset,
        "stage": c.stage,
        "inputs": dict(c.inputs),
        "artifacts": [_artifact_to(a) for a in c.artifacts],
        "verified_by": [_rule_to(r) for r in c.verified_by],
        "next_stage": c.next_stage,
        "workflow_version": c.workflow_version,
        "created_at": c.created_at,
    }


def _checkpoint_from(d: dict[str, Any]) -> Checkpoint:
    return Checkpoint(
        checkpoint_id=d["checkpoint_id"],
        run_id=d["run_id"],
        last_seq=d["last_seq"],
        partition=d["partition"],
        offset=d["offset"],
        stage=d["stage"],
        created_at=d["created_at"],
        inputs=d["inputs"],
        artifacts=tuple(_artifact_from(a) for a in d["artifacts"]),
        verified_by=tuple(_rule_from(r) for r in d["verified_by"]),
        next_stage=d["next_stage"],
        workflow_version=d["workflow_version"],
    )


def _effect_to(e: Effect) -> dict[str, Any]:
    return {
        "delivery_key": e.delivery_key,
        "run_id": e.run_id,
        "target": e.target,
        "status": e.status.value,
        "external_id": e.external_id,
        "tool": e.tool,
        "stage": e.stage,
        "seq": e.seq,
        "updated_at": e.updated_at,
    }


def _effect_from(d: dict[str, Any]) -> Effect:
    return Effect(
        delivery_key=d["delivery_key"],
        run_id=d["run_id"],
        target=d["target"],
        status=EffectStatus(d["status"]),
        seq=d["seq"],
        updated_at=d["updated_at"],
        external_id=d["external_id"],
        tool=d["tool"],
        stage=d["stage"],
    )


def _resume_to(r: ResumeRequest) -> dict[str, Any]:
    return {
        "run_id": r.run_id,
        "reason": r.reason,
        "requested_by": r.requested_by,
        "requested_at": r.requested_at,
    }


def _resume_from(d: dict[str, Any]) -> ResumeRequest:
    return ResumeRequest(d["run_id"], d["requested_at"], d["reason"], d["requested_by"])


T = TypeVar("T")


@dataclass(frozen=True)
class Kind(Generic[T]):
    """A record: its Avro full name, its Python type and the mapping each way."""

    record_name: str
    py_type: type[T]
    to_dict: Callable[[T], dict[str, Any]]
    from_dict: Callable[[dict[str, Any]], T]


KINDS: dict[type[Any], Kind[Any]] = {
    RunEvent: Kind("runlog.RunEvent", RunEvent, _event_to, _event_from),
    Checkpoint: Kind("runlog.Checkpoint", Checkpoint, _checkpoint_to, _checkpoint_from),
    Effect: Kind("runlog.Effect", Effect, _effect_to, _effect_from),
    ResumeRequest: Kind("runlog.ResumeRequest", ResumeRequest, _resume_to, _resume_from),
}
