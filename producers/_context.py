"""The run context a stage function receives: inputs, earlier outputs, and tool calls.

Each tool call is recorded as it happens (DESIGN.md, rule 3):
``TOOL_CALLED`` (args artifact, request hash, idempotency key for IDEMPOTENT
tools), for effect tools a *confirmed* ``EFFECT_INTENT`` before the tool
function is entered and ``EFFECT_RESULT`` (external id) after it, then
``TOOL_RESULT`` (result artifact). A call that fails for good appends
``FAILED`` (stage, tool, call_id, error) instead of ``TOOL_RESULT``; the stage has
then failed and the context refuses further calls.

Call ids are ``f"{stage}/{tool}/{index}"``, ``index`` counting this stage's calls
in submission order, so re-running a stage reproduces them. Calls whose id is in
``recorded_calls`` are not made again: their recorded result is returned and
nothing is appended. Calls in ``reconciled`` are not made either: the external
record stands in for the result and one ``TOOL_RESULT`` with attribute
``source=reconciled`` is appended.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

from producers._artifacts import ArtifactStore
from producers._keys import canonical_json, delivery_key, idempotency_key, sha256_hex
from producers._session import RunSession
from producers._tools import CallInfo, Tool, call_with_retry
from schemas._types import ArtifactRef, ErrorInfo, EventType, ReplayPolicy
from schemas.errors import DeliveryError, LeaseLost, TerminalToolError, WorkflowDefinitionError

__all__ = ["JSON", "StageContext", "StageOutputs", "error_info", "require_mapping"]

JSON = "application/json"


def error_info(err: BaseException) -> ErrorInfo:
    """An exception as the ``ErrorInfo`` a ``FAILED`` event carries."""
    kind = getattr(err, "kind", None) or type(err).__name__
    retryable = bool(getattr(err, "retryable", False))
    return ErrorInfo(str(kind), str(err)[:2000] or type(err).__name__, retryable)


class StageOutputs:
    """Outputs of verified stages, given as dicts or artifact refs (loaded and verified lazily)."""

    def __init__(self, store: ArtifactStore, given: Mapping[str, Mapping[str, Any] | ArtifactRef]) -> None:
        self._store = store
        self._given = dict(given)
        self._loaded: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()

    def __contains__(self, stage: object) -> bool:
        return stage in self._given or stage in self._loaded

    def __setitem__(self, stage: str, output: Mapping[str, Any]) -> None:
        with self._lock:
            self._loaded[stage] = dict(output)

    def get(self, stage: str) -> dict[str, Any]:
        with self._lock:
            if stage in self._loaded:
                return self._loaded[stage]
            if stage not in self._given:
                raise KeyError(stage)
            v = self._given[stage]
            out = json.loads(self._store.get(v)) if isinstance(v, ArtifactRef) else dict(v)
            self._loaded[stage] = out
            return out

    def as_dict(self) -> dict[str, dict[str, Any]]:
        return {s: self.get(s) for s in [*self._given, *self._loaded]}


class StageContext:
    """What a stage function gets as ``ctx``; safe to use from several threads."""

    def __init__(self, session: RunSession, stage: str, store: ArtifactStore, outputs: StageOutputs, *,
                 recorded_calls: Mapping[str, ArtifactRef], reconciled: Mapping[str, Mapping[str, Any]],
                 max_parallel: int = 8) -> None:
        self.session = session
        self.stage = stage
        self.store = store
        self._outputs = outputs
        self._recorded = recorded_calls
        self._reconciled = reconciled
        self._max_parallel = max_parallel
        self._lock = threading.Lock()
        self._next_index = 0
        self._artifacts: dict[str, ArtifactRef] = {}
        self._futures: list[Future[Any]] = []
        self._pool: ThreadPoolExecutor | None = None
        self.failure: BaseException | None = None

    @property
    def run_id(self) -> str:
        return self.session.run_id

    @property
    def epoch(self) -> int:
        """The writer's lease epoch (the fencing token)."""
        return self.session.epoch

    @property
    def params(self) -> dict[str, Any]:
        return self.session.params

    def output_of(self, stage: str) -> dict[str, Any]:
        """The verified output of an earlier stage of this run."""
        return self._outputs.get(stage)

    def put_artifact(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        """Store bytes; the ref is listed in this stage's ``VERIFIED`` artifacts."""
        ref = self.store.put(data, media_type)
        self._add(ref)
        return ref

    @property
    def artifacts(self) -> tuple[ArtifactRef, ...]:
        with self._lock:
            return tuple(self._artifacts.values())

    def _add(self, ref: ArtifactRef) -> None:
        with self._lock:
            self._artifacts.setdefault(ref.sha256, ref)

    def _claim_index(self) -> int:
        with self._lock:
            if self.failure is not None:
                raise self.failure
            i = self._next_index
            self._next_index += 1
            return i

    # -- calling tools ------------------------------------------------------------------------

    def call(self, tool: Tool, /, **args: Any) -> Any:
        """Call a tool now and return its result (recorded on the log)."""
        return self._invoke(tool, self._claim_index(), args)

    def submit(self, tool: Tool, /, **args: Any) -> Future[Any]:
        """Start a tool call in the background; its call index is taken now (submission order)."""
        index = self._claim_index()
        with self._lock:
            if self._pool is None:
                self._pool = ThreadPoolExecutor(self._max_parallel, thread_name_prefix=f"runlog-{self.stage}")
            fut = self._pool.submit(self._invoke, tool, index, args)
            self._futures.append(fut)
        return fut

    def parallel(self, *calls: tuple[Tool, Mapping[str, Any]]) -> list[Any]:
        """Run ``(tool, args)`` calls concurrently; results in order. The first failure is raised
        after all calls have finished."""
        futures = [self.submit(t, **a) for t, a in calls]
        wait(futures)
        return [f.result() for f in futures]

    def finish(self) -> None:
        """Wait for every submitted call (so nothing is appended after the stage ends)."""
        with self._lock:
            futures, pool = list(self._futures), self._pool
        wait(futures)
        if pool is not None:
            pool.shutdown(wait=True)

    def _invoke(self, tool: Tool, index: int, args: Mapping[str, Any]) -> Any:
        s, stage = self.session, self.stage
        call_id = f"{stage}/{tool.name}/{index}"
        common: dict[str, Any] = {"stage": stage, "tool": tool.name, "call_id": call_id,
                                  "replay_policy": tool.policy}
        args_bytes = canonical_json(dict(args))
        request_hash = sha256_hex(args_bytes)
        if call_id in self._recorded:
            ref = self._recorded[call_id]
            result = json.loads(self.store.get(ref))
            self._add(ref)
            return result
        if call_id in self._reconciled:
            record = dict(self._reconciled[call_id])
            ref = self.put_artifact(canonical_json(record), JSON)
            s.append(EventType.TOOL_RESULT, payload_ref=ref, external_id=_external_id(record),
                     attributes={"source": "reconciled"}, **common)
            return record
        idem = (idempotency_key(s.run_id, stage, tool.name, index, request_hash)
                if tool.policy is ReplayPolicy.IDEMPOTENT else None)
        info = CallInfo(s.run_id, stage, tool.name, call_id, index, s.epoch, request_hash, idem)
        args_ref = self.put_artifact(args_bytes, JSON)
        s.append(EventType.TOOL_CALLED, idempotency_key=idem, payload_ref=args_ref,
                 request_hash=request_hash, **common)
        if tool.effect:
            assert tool.delivery is not None  # checked at definition time
            info = dataclasses.replace(info, delivery_key=delivery_key(*tool.delivery(args, info)))
            s.lease.verify()  # a round trip: refuse to start an effect without the lease
            s.append(EventType.EFFECT_INTENT, confirm=True, delivery_key=info.delivery_key,
                     target=tool.target, request_hash=request_hash, **common)
        s.crash_point(f"inside:TOOL:{call_id}")

        def attempt(n: int) -> Any:
            s.check()
            return tool.fn(dataclasses.replace(info, attempt=n), **args)

        def before_retry(n: int) -> None:
            if tool.effect:
                s.lease.verify()
            else:
                s.check()

        try:
            result, attempts = call_with_retry(attempt, tool.retry, before_retry=before_retry)
            result_bytes = canonical_json(result)
            if tool.effect and _external_id(result) is None:
                raise TerminalToolError(f"effect tool {tool.name!r} must return a JSON object with a "
                                        f"string 'external_id', got {type(result).__name__}",
                                        kind="InvalidEffectResult")
        except (LeaseLost, DeliveryError):
            raise
        except Exception as err:  # any tool failure is recorded, then re-raised
            self._record_failure(err, info, common)
            raise
        if tool.effect:
            s.append(EventType.EFFECT_RESULT, delivery_key=info.delivery_key, target=tool.target,
                     external_id=_external_id(result), **common)
        ref = self.put_artifact(result_bytes, JSON)
        s.append(EventType.TOOL_RESULT, payload_ref=ref, attributes={"attempts": str(attempts)}, **common)
        return result

    def _record_failure(self, err: Exception, info: CallInfo, common: dict[str, Any]) -> None:
        with self._lock:
            if self.failure is None:
                self.failure = err
        self.session.append(EventType.FAILED, error=error_info(err), delivery_key=info.delivery_key,
                            **common)


def _external_id(record: Any) -> str | None:
    if isinstance(record, Mapping):
        v = record.get("external_id")
        if isinstance(v, str) and v:
            return v
    return None


def require_mapping(stage: str, out: Any) -> dict[str, Any]:
    if not isinstance(out, Mapping):
        raise WorkflowDefinitionError(f"stage {stage!r} must return a JSON object, got {type(out).__name__}")
    return dict(out)
