"""``runlog replay``: what a recorded run would have done with another model or other parameters.

A replay is a new run of the recorded run's workflow and version, with its parameters (changed by
``--set``) and its pinned input versions, in an *evaluation namespace* of its own: topics
``<prefix>eval-<id>.`` and Redis keys ``<redis prefix>:eval-<id>``, so it never touches the live
projections, the live effects ledger or the live topics, and it is itself recorded (``runlog show``,
``runlog audit`` read it with ``RUNLOG_TOPIC_PREFIX`` / ``RUNLOG_REDIS_PREFIX`` set to the namespace).

Before each of its tool calls is executed, the replay decides (:mod:`runlog.producers.calls._replay_hook`):

* a **model call** (a tool that reports usage, such as a Pydantic AI agent's model requests) is made
  anew, with ``--model`` when given (the agents of the run use that model instead of their own);
* a call whose position (``stage/tool/index``) and request hash match the recorded run's is
  **served** the recorded result, whatever its replay policy: the tool does not run, so a recorded
  charge, reservation or email is never made again (``ctx.random()``, ``ctx.now()`` and
  ``ctx.uuid()`` are served the same way, so the replay draws what the recorded run drew);
* any other call of a **read** (a ``SAFE`` or ``IDEMPOTENT`` tool that is not an effect) is
  **executed** anew;
* any other call of an **effect** tool (any policy) is **not made**: the replay stops there with the
  reason (:class:`~runlog.producers.calls._replay_hook.NotReplayed`), as its report says.

The report compares the two runs: each stage's output (same, changed, or not reached), the calls
(served, executed, made anew, stopped, and recorded calls the replay did not make), and what the
model calls spent (tokens and cost: the recorded run's against the replay's).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from runlog.processors.admin import ensure_topics
from runlog.processors.operate import OperatorRefused
from runlog.producers import App, CallInfo, Tool
from runlog.producers.internal import EXECUTE, NotReplayed, register, unregister
from runlog.projections import RunState, RunStatus
from runlog.projections.internal import UsageTotals
from runlog.schemas import EventType
from runlog.schemas.settings import Settings

__all__ = ["CallOutcome", "ReplayReport", "drop_namespace", "eval_namespaces", "eval_settings",
           "replay_cohort", "replay_run"]

SERVED, EXECUTED, ANEW, STOPPED, NOT_MADE = "served", "executed", "anew", "stopped", "not made"


@dataclass(frozen=True)
class CallOutcome:
    call_id: str
    tool: str
    how: str
    """``served`` (the recorded result, the tool not run), ``executed`` (a read run anew),
    ``anew`` (a model call made again), ``stopped`` (an effect not made: the replay stops),
    ``not made`` (recorded, but the replay never reached or asked it)."""
    detail: str = ""


@dataclass
class ReplayReport:
    """A replay of one run, compared with it."""

    run_id: str
    replay_run_id: str
    namespace: str
    workflow: str
    model: str | None
    params: dict[str, Any]
    status: str
    """The replay's end: ``completed``, ``stopped`` (at an effect it does not make) or ``failed``."""
    reason: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    """Stage -> ``same`` | ``changed (keys that differ)`` | ``not reached`` | ``new``."""
    calls: list[CallOutcome] = field(default_factory=list)
    recorded_usage: UsageTotals | None = None
    replay_usage: UsageTotals | None = None

    def counts(self) -> dict[str, int]:
        out = {k: 0 for k in (SERVED, EXECUTED, ANEW, STOPPED, NOT_MADE)}
        for c in self.calls:
            out[c.how] += 1
        return out

    def to_dict(self) -> dict[str, Any]:
        def usage(u: UsageTotals | None) -> dict[str, Any] | None:
            return None if u is None else {"calls": u.calls, "input_tokens": u.input_tokens,
                                           "output_tokens": u.output_tokens, "cost_nanos": u.cost_nanos}
        return {"run_id": self.run_id, "replay_run_id": self.replay_run_id, "namespace": self.namespace,
                "workflow": self.workflow, "model": self.model, "params": self.params, "status": self.status,
                "reason": self.reason, "outputs": self.outputs, "counts": self.counts(),
                "calls": [vars(c) for c in self.calls],
                "recorded_usage": usage(self.recorded_usage), "replay_usage": usage(self.replay_usage)}


def eval_settings(settings: Settings, namespace: str) -> Settings:
    """``settings`` moved into the evaluation namespace ``namespace`` (topics and Redis keys)."""
    return settings.with_(topic_prefix=f"{settings.topic_prefix}{namespace}.",
                          redis_prefix=f"{settings.redis_prefix}:{namespace}")


#: every evaluation namespace is named ``eval-<10 hex digits>``
_NAMESPACE = re.compile(r"eval-[0-9a-f]{10}")


def eval_namespaces(settings: Settings) -> list[str]:
    """The evaluation namespaces with topics on the broker under ``settings``' topic prefix."""
    from runlog.processors.admin import admin_client

    names = admin_client(settings).list_topics(timeout=30).topics
    found = {name[len(settings.topic_prefix):].partition(".")[0] for name in names
             if name.startswith(settings.topic_prefix)}
    return sorted(ns for ns in found if _NAMESPACE.fullmatch(ns))


def drop_namespace(settings: Settings, namespace: str) -> tuple[list[str], int]:
    """Delete the evaluation namespace ``namespace`` of ``settings``: its topics and its Redis keys
    (the live topics and keys are never touched). The topics and the number of keys deleted."""
    from runlog.processors.admin import admin_client
    from runlog.projections.internal import delete_namespace
    from runlog.schemas.internal import redis_client

    if not _NAMESPACE.fullmatch(namespace):
        raise OperatorRefused(f"{namespace!r} is not an evaluation namespace (eval-<10 hex digits>)")
    es = eval_settings(settings, namespace)
    admin = admin_client(settings)
    topics = sorted(t for t in admin.list_topics(timeout=30).topics if t.startswith(es.topic_prefix))
    if topics:
        for future in admin.delete_topics(topics, operation_timeout=30).values():
            future.result()
        deadline = time.monotonic() + 30  # the broker answers before every metadata view has caught up
        while time.monotonic() < deadline and set(topics) & set(admin.list_topics(timeout=30).topics):
            time.sleep(0.2)
    client = redis_client(settings)
    try:
        keys = delete_namespace(client, es.redis_prefix)
    finally:
        client.close()
    return topics, keys


def _is_model(tool: Tool) -> bool:
    return tool.usage is not None


class _Decider:
    """The replay's interceptor: what each call of the replay's run gets (module docstring)."""

    def __init__(self, recorded: Mapping[str, tuple[str | None, Any, str]], store: Any) -> None:
        self.recorded = recorded  # call id -> (request hash, result ref, tool)
        self.store = store
        self.outcomes: dict[str, CallOutcome] = {}

    def __call__(self, tool: Tool, call: CallInfo, args: Mapping[str, Any]) -> Any:
        rec = self.recorded.get(call.call_id)
        if _is_model(tool):
            self.outcomes[call.call_id] = CallOutcome(call.call_id, tool.name, ANEW)
            return EXECUTE
        if rec is not None and rec[0] == call.request_hash and rec[1] is not None:
            self.outcomes[call.call_id] = CallOutcome(call.call_id, tool.name, SERVED)
            return json.loads(self.store.get(rec[1]))
        if tool.effect:
            why = ("the recorded run made no such call" if rec is None else
                   "its request is not the recorded one" if rec[0] != call.request_hash else
                   "the recorded run has no result for it")
            detail = f"effect {tool.name} ({tool.policy.value}) not made in a replay: {why}"
            self.outcomes[call.call_id] = CallOutcome(call.call_id, tool.name, STOPPED, detail)
            raise NotReplayed(f"{call.call_id}: {detail}", kind="NotReplayed")
        why = "no recorded call here" if rec is None else "request changed"
        self.outcomes[call.call_id] = CallOutcome(call.call_id, tool.name, EXECUTED, why)
        return EXECUTE


def _load(settings: Settings, app: App, run_id: str) -> tuple[RunState, dict[str, Any], Any]:
    from runlog.processors.resume import Resumer, UnknownRun

    with Resumer(settings, app) as r:
        try:
            state, _ = r.load(run_id)
        except UnknownRun as err:
            raise OperatorRefused(str(err)) from err
        doc = json.loads(r.artifacts.get(state.params_ref)) if state.params_ref is not None else {}
        return state, dict(doc) if isinstance(doc, dict) else {}, r.artifacts


def _recorded_calls(settings: Settings, run_id: str) -> dict[str, tuple[str | None, Any, str]]:
    """``call id -> (request hash, result ref, tool)`` of every call the run's log records, in log
    order (a call recorded again, by a resume or after an upgrade, keeps its latest record). The
    run's state keeps only the calls since its last checkpoint; the replay needs them all."""
    from runlog.processors.inspect.log import run_history

    out: dict[str, tuple[str | None, Any, str]] = {}
    for le in run_history(settings, run_id):
        ev = le.event
        if not le.outcome.accepted or ev.call_id is None:
            continue
        if ev.type is EventType.TOOL_CALLED:
            out.pop(ev.call_id, None)
            out[ev.call_id] = (ev.request_hash, None, ev.tool or "?")
        elif ev.type in (EventType.TOOL_RESULT, EventType.EFFECT_RECONCILED) and ev.call_id in out \
                and ev.payload_ref is not None:
            req, _, tool = out[ev.call_id]
            out[ev.call_id] = (req, ev.payload_ref, tool)
    return out


#: what a dumped model conversation (Pydantic AI's messages, in a stage's output) carries that
#: differs on every run by nature, not by what the run did: a message's times, run and ids, a
#: part's time, and a tool call id Pydantic AI generated (``pyd_ai_<random>``)
_MESSAGE_KINDS = frozenset({"request", "response"})
_VOLATILE_MESSAGE_KEYS = ("timestamp", "request_timestamp", "duration", "run_id", "conversation_id",
                          "provider_response_id")
_GENERATED_CALL_ID = "pyd_ai_"


def _comparable(value: Any) -> Any:
    """``value`` without the volatile fields of the model messages it holds (a dict with a
    ``parts`` list and a ``kind`` of ``request`` or ``response``); anything else as it is."""
    if isinstance(value, list):
        return [_comparable(v) for v in value]
    if not isinstance(value, dict):
        return value
    out = {k: _comparable(v) for k, v in value.items()}
    if value.get("kind") in _MESSAGE_KINDS and isinstance(value.get("parts"), list):
        for key in _VOLATILE_MESSAGE_KEYS:
            out.pop(key, None)
        out["parts"] = [_comparable_part(p) if isinstance(p, dict) else p for p in out["parts"]]
    return out


def _comparable_part(part: dict[str, Any]) -> dict[str, Any]:
    out = {k: v for k, v in part.items() if k != "timestamp"}
    call_id = out.get("tool_call_id")
    if isinstance(call_id, str) and call_id.startswith(_GENERATED_CALL_ID):
        out["tool_call_id"] = _GENERATED_CALL_ID + "*"
    return out


def _compare(was: Any, now: Any) -> str:
    """``same``, or ``changed`` naming the top-level keys that differ when both are objects; the
    volatile fields of model messages (their times) are no change (:func:`_comparable`)."""
    was, now = _comparable(was), _comparable(now)
    if was == now:
        return "same"
    if isinstance(was, dict) and isinstance(now, dict):
        keys = sorted(k for k in {*was, *now} if was.get(k) != now.get(k))
        return f"changed ({', '.join(keys)})"
    return "changed"


def _outputs(state: RunState, store: Any) -> dict[str, Any]:
    return {stage: json.loads(store.get(ref)) for stage, ref in state.stage_outputs.items()}


def replay_run(settings: Settings, app: App, run_id: str, *, model: str | None = None,
               set_params: Mapping[str, Any] | None = None, namespace: str | None = None) -> ReplayReport:
    """Replay the recorded run ``run_id`` of ``settings``' namespace with ``app`` (module docstring).

    Raises:
        OperatorRefused: the run is unknown, has no workflow, or ``app`` does not register its
            workflow at its version.
    """
    from runlog.processors.resume import Resumer
    from runlog.producers import Runner

    state, params, store = _load(settings, app, run_id)
    wf = state.workflow
    if wf is None:
        raise OperatorRefused(f"run {run_id} has no accepted RUN_STARTED: nothing to replay")
    if not app.registry.serves(wf.name, wf.version):
        raise OperatorRefused(f"run {run_id} is {wf.name}@{wf.version}; the App does not register that "
                              "version")
    workflow = app.registry.get(wf.name, wf.version)
    params = {**params, **(set_params or {})}
    ns = namespace or f"eval-{uuid.uuid4().hex[:10]}"
    es = eval_settings(settings, ns)
    ensure_topics(es)
    recorded = _recorded_calls(settings, run_id)
    decide = _Decider(recorded, store)
    report = ReplayReport(run_id, "", ns, f"{wf.name}@{wf.version}", model, params, "failed",
                          recorded_usage=state.usage)
    with Runner.from_settings(es, source=app.source, prices=app.prices) as runner:
        h = runner.start_run(workflow, params, dict(state.input_versions))
        report.replay_run_id = h.run_id
        assert h.session is not None
        register(h.run_id, decide, model)
        try:
            result = runner.execute(h.session)
            report.status = "completed" if result.completed else "failed"
        except NotReplayed as err:
            report.status, report.reason = "stopped", str(err)
        except Exception as err:  # noqa: BLE001 -- the replay's own failure is its result
            report.status, report.reason = "failed", f"{type(err).__name__}: {err}"
        finally:
            unregister(h.run_id)
    with Resumer(es, app) as r:
        replayed, _ = r.load(h.run_id)
    report.replay_usage = replayed.usage
    before, after = _outputs(state, store), _outputs(replayed, store)
    for stage in workflow.spec().stage_names:
        if stage not in after:
            report.outputs[stage] = "not reached"
        elif stage not in before:
            report.outputs[stage] = "new"
        else:
            report.outputs[stage] = _compare(before[stage], after[stage])
    made = decide.outcomes
    report.calls = [made[k] for k in sorted(made, key=lambda k: replayed.calls[k].seq
                                            if k in replayed.calls else 1 << 60)]
    report.calls += [CallOutcome(call_id, tool, NOT_MADE) for call_id, (_, _, tool) in recorded.items()
                     if call_id not in made]
    return report


def replay_cohort(settings: Settings, app: App, workflow: str, since_ms: int, *, model: str | None = None,
                  set_params: Mapping[str, Any] | None = None,
                  limit: int | None = None) -> tuple[str, list[ReplayReport]]:
    """Replay every completed run of ``workflow`` started at or after ``since_ms`` (from the
    projection), oldest first, into one evaluation namespace; that namespace and the reports."""
    from runlog.projections import RedisStore

    store = RedisStore.from_settings(settings)
    try:
        ids = store.runs(RunStatus.COMPLETED)
        states = store.load_states(ids) if ids else {}
    finally:
        store.client.close()
    chosen = sorted((s for s in states.values()
                     if s.workflow is not None and s.workflow.name == workflow and s.started_at >= since_ms),
                    key=lambda s: (s.started_at, s.run_id))
    if limit is not None:
        chosen = chosen[:limit]
    ns = f"eval-{uuid.uuid4().hex[:10]}"
    return ns, [replay_run(settings, app, s.run_id, model=model, set_params=set_params, namespace=ns)
                for s in chosen]


def summary_table(reports: Sequence[ReplayReport]) -> str:
    """One line per replay: the run, its end, outputs changed, calls served / executed / anew / not
    made, tokens and cost recorded against replayed."""
    def cost(u: UsageTotals | None) -> str:
        if u is None or u.cost_nanos is None:
            return "-"
        return f"${u.cost_nanos / 1e9:.4f}"

    def tokens(u: UsageTotals | None) -> str:
        return "-" if u is None or not u.calls else str(u.input_tokens + u.output_tokens)

    head = (f"{'run':<38} {'replay':<10} {'outputs changed':<16} {'served':>6} {'executed':>8} "
            f"{'anew':>5} {'not made':>8} {'tokens (was)':>14} {'cost (was)':>20}")
    lines = [head]
    for rep in reports:
        n = rep.counts()
        changed = sum(1 for v in rep.outputs.values() if v.startswith("changed"))
        lines.append(f"{rep.run_id:<38} {rep.status:<10} {changed:<16} {n[SERVED]:>6} {n[EXECUTED]:>8} "
                     f"{n[ANEW]:>5} {n[NOT_MADE] + n[STOPPED]:>8} "
                     f"{tokens(rep.replay_usage) + ' (' + tokens(rep.recorded_usage) + ')':>14} "
                     f"{cost(rep.replay_usage) + ' (' + cost(rep.recorded_usage) + ')':>20}")
    return "\n".join(lines)
