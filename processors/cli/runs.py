"""``runlog runs|show|resume|resumer|branch|demo``: looking at runs and continuing them."""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import UTC
from typing import Any

from runlog.processors.cli.codes import EXIT_FOUND, EXIT_OK
from runlog.processors.cli.resume import DEMO_APP as _DEMO_APP
from runlog.processors.cli.resume import register as register_resume
from runlog.schemas import ConfigError, Settings, now_ms

_STATUSES = ["PENDING", "RUNNING", "WAITING", "BLOCKED", "COMPLETED", "FAILED", "CANCELLED", "SUBMITTED"]
"""``runlog.projections.RunStatus`` values (not imported here: the CLI imports drivers lazily), and
``SUBMITTED``: a submitted run waiting in a queue (``runlog queues``)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("runs", help="list runs: workflow, status, why blocked or waiting, open effects, "
                       "tokens and cost",
                       description="From the Redis projection; when no projector has written it (or it "
                       "lists no runs), from the events topic, with a note on stderr. A projection not "
                       "marked ready (a rebuild --swap moving it) is listed with a note on stderr.")
    p.add_argument("--status", type=str.upper, choices=_STATUSES,
                   help="list only the runs with this status (any case)")
    p.add_argument("--json", action="store_true", help="print one JSON array, an object per run")
    p.set_defaults(func=_runs)

    p = sub.add_parser("show", help="draw a run's timeline and calls from the log",
                       description="Stages, events, checkpoints with artifacts, each tool call (full "
                       "delivery key, external id, whether its result was executed, reused, reconciled "
                       "or resolved), effects, lease epochs, rejected events and model usage (tokens and "
                       "cost; a branch's inherited spend apart), all from the events "
                       "topic. --payloads adds each call's arguments and result from the artifact store "
                       "(truncated; anything that looks like a credential is masked).")
    p.add_argument("run_id", help="the run to show")
    p.add_argument("--at", help="show the state as of this seq (a number) or time (ISO 8601)")
    p.add_argument("--payloads", action="store_true",
                   help="also print the run's parameters and each call's arguments and result")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_show)

    register_resume(sub)  # resume, resumer (processors/cli/resume.py)

    p = sub.add_parser(
        "branch", help="branch a run with new input versions (explicit upgrade)",
        description="Start a new run (parent_run_id = RUN) forked at the last checkpoint before the first "
                    "stage that reads a changed input: the stages before it are inherited (not run), the "
                    "rest run again on the new versions. Effects go through the ledger: one done in the "
                    "parent is reused, one in doubt there blocks the branch. Exit 0 when the branch "
                    "completed, 1 when it did not (blocked or failed: the line says where).")
    p.add_argument("run_id", help="the run to branch")
    p.add_argument("--input", action="append", required=True, metavar="NAME=VERSION",
                   help="an input the run reads, at its new version (repeat for several)")
    p.add_argument("--app", default=_DEMO_APP,
                   help="module:attribute of the runlog.App with the run's workflow "
                        f"(default {_DEMO_APP})")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_branch)

    p = sub.add_parser("demo", help="the crash-and-resume demo (the seed's content pipeline)",
                       description="Runs the content pipeline once uncrashed and once killed at "
                       "--crash-at, resumes the crashed run through the resumer group, and prints "
                       "a timeline and a receipt comparing both.")
    p.add_argument("--crash-at", default=None,
                   help="the crash point, e.g. before:EFFECT_RESULT:visual/upload/5 (default: while "
                   "uploading the cover), inside:STAGE:draft, after:EFFECT_INTENT:publish/publish/0")
    p.add_argument("--sdk", choices=["sync", "async"], default="sync",
                   help="the workers run the Runner (sync, default) or the AsyncRunner on an asyncio loop")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=_demo)


def _age(ms: int) -> str:
    s = max(0, (now_ms() - ms) // 1000)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h"


def _runs(args: argparse.Namespace) -> int:
    from runlog.processors.inspect import run_summary, runs_from_log, text_opener
    from runlog.projections import RedisStore, RunState
    from runlog.projections.internal import READY

    settings = Settings.from_env()
    store = RedisStore.from_settings(settings)
    try:
        marker = store.marker()
        projected = marker is not None
        whole = projected and marker is not None and marker.state == READY
        ids = store.runs() if whole else []
        states = store.load_states(ids) if ids else {}
    finally:
        store.client.close()
    rows: list[RunState] = [states[i] for i in ids if i in states]
    if ids:
        from runlog.processors.admin import check_kafka_credentials

        check_kafka_credentials(settings)  # a wrong password is exit 4 here too, though Redis answered
    if not ids:
        where = f"prefix {settings.redis_prefix!r}"
        if marker is not None and not whole:  # a swap moving it, a rebuild, a replay: not the truth
            print(f"runlog runs: listed from the events topic: the projection ({where}) is marked "
                  f"{marker.state!r} (a rebuild or a swap is moving it, one stopped midway, or a new "
                  "projector is replaying the log), so its indexes are not read until it is ready",
                  file=sys.stderr)
        else:
            why = ("no projector has written the projection" if not projected
                   else "the projection lists no runs")
            print(f"runlog runs: listed from the events topic: {why} in Redis ({where}); start "
                  "`runlog project` to keep it", file=sys.stderr)
        rows = sorted(runs_from_log(settings).values(), key=lambda s: (s.updated_at, s.run_id))
    if args.status:
        rows = [s for s in rows if s.status.value == args.status]
    opener = text_opener(settings)
    docs = [run_summary(s, opener) for s in rows]
    known = {s.run_id for s in rows}
    queued = {r: w for r, w in _queue_waits(settings, None).items() if r not in known} \
        if args.status in (None, "SUBMITTED") else {}
    waits = _version_waits(settings, [d["run_id"] for d in docs if d["status"] in _OPEN])
    for d in docs:
        view = waits.get(d["run_id"])
        d["waiting_for_version"] = None if view is None else {"version": view.label,
                                                               "members": list(view.members)}
    if args.json:
        print(json.dumps([*docs, *({"run_id": r, "status": "SUBMITTED", "workflow": None,
                                    "queued": w.to_dict()} for r, w in sorted(queued.items()))]))
        return EXIT_OK
    cells: list[tuple[str, ...]] = [
        (str(d["run_id"]), f"{d['workflow']}@{d['workflow_version']}" if d["workflow"] else "-",
         str(d["status"]), str(d["stage"] or "-"), str(d["next_stage"] or "-"), str(d["last_seq"]),
         str(d["epoch"]), _age(d["updated_at"]), *_spend(d["usage"]["total"])) for d in docs]
    head = ("run", "workflow", "status", "stage", "next", "seq", "epoch", "age", "tokens", "cost")
    # each column as wide as its widest cell (long workflow or stage names do not shift the others)
    widths = [max(len(r[i]) for r in [head, *cells]) for i in range(len(head))]
    right = {5, 6, 7, 8, 9}

    def line(cells: tuple[str, ...]) -> str:
        return " ".join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(cells, widths, strict=True))).rstrip()

    print(line(head))
    for d, row in zip(docs, cells, strict=True):
        print(line(row))
        if d["reason"]:
            print(f"    reason: {d['reason']}")
        if d["run_id"] in waits:
            print(f"    {waits[d['run_id']].describe()}")
        for e in d["open_effects"]:
            print(f"    open effect: {e['tool'] or '?'} {e['call_id'] or '?'} [{e['policy'] or '?'}] "
                  f"delivery key {e['delivery_key']}")
    if queued:
        print(f"submitted, not started ({len(queued)}):")
        for r, w in sorted(queued.items()):
            print(f"  {r}  {w.describe()}")
    return EXIT_OK


_OPEN = ("PENDING", "RUNNING", "WAITING")


def _spend(total: dict[str, Any]) -> tuple[str, str]:
    """The tokens and cost cells of a run (``-`` when it recorded none, ``?`` for a cost without a
    price for some of its calls)."""
    if not total["calls"]:
        return "-", "-"
    tokens = total["input_tokens"] + total["output_tokens"]
    cost = "-" if total["cost_nanos"] is None else f"${total['cost_nanos'] / 1e9:.4f}"
    if total["unpriced_calls"] and total["cost_nanos"] is not None:
        cost += "+?"
    return f"{tokens:,}", cost


def _version_waits(settings: Settings, run_ids: list[str]) -> dict[str, Any]:
    """The runs of ``run_ids`` parked for a member serving their ``workflow@version``
    (:mod:`runlog.processors.resume._versions`), with their label's view."""
    from runlog.processors.resume._versions import VersionRoutes
    from runlog.schemas.internal import redis_client

    if not run_ids:
        return {}
    client = redis_client(settings)
    try:
        return dict(VersionRoutes(client, settings.redis_prefix).waits(run_ids))
    finally:
        client.close()


def _queue_waits(settings: Settings, run_ids: list[str] | None) -> dict[str, Any]:
    """Submitted runs waiting in a queue (:mod:`runlog.processors.fleet._queues`) with where and why:
    those of ``run_ids``, or (None) every one."""
    from runlog.processors.fleet._queues import waiting_runs, where_waits
    from runlog.schemas.internal import redis_client

    client = redis_client(settings)
    try:
        ids = waiting_runs(client, settings.redis_prefix) if run_ids is None else run_ids
        found = {r: where_waits(client, settings.redis_prefix, r) for r in ids}
    finally:
        client.close()
    return {r: w for r, w in found.items() if w is not None}


def _parse_at(at: str | None) -> tuple[int | None, int | None]:
    if at is None:
        return None, None
    if at.isdigit():
        return int(at), None
    from datetime import datetime

    try:
        dt = datetime.fromisoformat(at)
    except ValueError as err:  # "notatime", "2026-13-45": one line, the usage exit code
        raise ConfigError(f"--at {at!r} is neither a seq nor an ISO 8601 time ({err})") from None
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=UTC)
    return None, int(dt.timestamp() * 1000)


def _state_dict(state: Any) -> dict[str, Any]:
    from runlog.processors.inspect.payloads import inline_refs_named

    doc: dict[str, Any] = inline_refs_named(json.loads(state.to_json()))  # refs, never inline payloads
    return doc


def _show(args: argparse.Namespace) -> int:
    from runlog.processors.inspect import (
        call_views,
        payload_text,
        payload_value,
        render_timeline,
        run_history,
        run_summary,
        text_opener,
        usage_lines,
    )
    from runlog.processors.inspect.children import child_tree
    from runlog.processors.operate import load_run
    from runlog.producers.internal import store_from_settings
    from runlog.projections.internal import effect_to_dict

    settings = Settings.from_env()
    seq, at_ms = _parse_at(args.at)
    history = run_history(settings, args.run_id, upto_seq=seq, upto_time_ms=at_ms)
    if not history:
        queued = _queue_waits(settings, [args.run_id]).get(args.run_id)
        if queued is not None:  # submitted, not started: where it waits, and why
            if args.json:
                print(json.dumps({"state": None, "status": "SUBMITTED", "queued": queued.to_dict()}))
            else:
                print(f"run {args.run_id}  SUBMITTED  {queued.describe()}")
            return EXIT_OK
        print(f"runlog show: no events for {args.run_id!r}", file=sys.stderr)
        return EXIT_FOUND
    state = history[-1].state
    opener = text_opener(settings)
    summary = run_summary(state, opener)
    calls = call_views(history)
    effects = [*state.open_intents, *sorted(state.closed_effects.values(), key=lambda e: e.seq)]
    store = store_from_settings(settings, inline=False) if args.payloads else None
    waits = _version_waits(settings, [state.run_id] if state.status.value in _OPEN else [])
    wait_view = waits.get(state.run_id)
    tree = child_tree(state, lambda run_id: load_run(settings, run_id)) if state.children else None
    parent = None if not (state.parent_run_id and state.parent_call) else \
        {"run_id": state.parent_run_id, "call_id": state.parent_call}
    if args.json:
        call_docs = [c.to_dict() for c in calls]
        doc: dict[str, Any] = {
            "state": _state_dict(state), "reason": summary["reason"], "waiting": summary["waiting"],
            "calls": call_docs, "effects": [effect_to_dict(e) for e in effects],
            "usage": {**summary["usage"],
                      "with_children": (tree.with_children if tree else state.total_usage).to_dict()},
            "parent": parent, "children": [c.to_dict() for c in tree.children] if tree else [],
            "waiting_for_version": None if wait_view is None else {"version": wait_view.label,
                                                                   "members": list(wait_view.members)},
            "events": [{"seq": h.event.seq, "epoch": h.event.epoch, "type": h.event.type.value,
                        "stage": h.event.stage, "offset": h.offset, "outcome": h.outcome.kind.value,
                        "call_id": h.event.call_id, "tool": h.event.tool,
                        "delivery_key": h.event.delivery_key, "external_id": h.event.external_id}
                       for h in history]}
        if store is not None:
            doc["params"] = payload_value(store, state.params_ref)
            for c, d in zip(calls, call_docs, strict=True):
                d["args_payload"] = payload_value(store, c.args)
                d["result_payload"] = payload_value(store, c.result)
        print(json.dumps(doc))
        return EXIT_OK
    print(f"run {state.run_id}  {state.workflow_name}@{state.workflow_version}  {state.status.value}"
          f"  seq {state.last_seq}  epoch {state.epoch}  inputs "
          + ", ".join(f"{k}={v}" for k, v in sorted(state.input_versions.items())))
    if summary["reason"]:
        print(f"reason: {summary['reason']}")
    if wait_view is not None:
        print(wait_view.describe())
    if parent is not None:
        print(f"child of {parent['run_id']} ({parent['call_id']})")
    elif state.parent_run_id:
        print(f"branched from {state.parent_run_id} at seq {state.forked_from_seq}")
    for line in usage_lines(state):
        print(line)
    if tree is not None:
        spent = tree.with_children
        if spent.calls:
            print(f"usage with children: {spent.describe()}")
        print(f"children: {len(tree.children)}")
        for line in tree.lines():
            print(line)
    print(render_timeline(history, opener))
    for cp in [h.outcome.checkpoint for h in history if h.outcome.checkpoint is not None]:
        print(f"checkpoint {cp.checkpoint_id} stage={cp.stage} next={cp.next_stage} "
              f"offset={cp.partition}:{cp.offset}")
        for a in cp.artifacts[-3:]:
            print(f"    {a.sha256[:16]} {a.media_type} {a.size}B")
    if store is not None:
        print("params:")
        print(_indent(payload_text(store, state.params_ref), 4))
    if calls:
        print("calls:")
    for c in calls:
        extra = "".join([f" external_id={c.external_id}" if c.external_id else "",
                         f" - {c.detail}" if c.detail else ""])
        print(f"  {c.call_id:<24} {c.tool or '?':<14} {c.policy or '-':<15} {c.how:<10} e{c.epoch}{extra}")
        if c.delivery_key:
            print(f"      delivery key {c.delivery_key}")
        if store is not None:
            print("      args:")
            print(_indent(payload_text(store, c.args), 8))
            print("      result:")
            print(_indent(payload_text(store, c.result), 8))
    for e in effects:
        print(f"effect {e.delivery_key} {e.target} {e.status.value} {e.tool or '?'} {e.call_id or '?'}"
              f" external_id={e.external_id}")
    if state.rejected_total:
        print(f"rejected events: {dict(state.rejected)}")
    return EXIT_OK


def _indent(text: str, n: int) -> str:
    return "\n".join(" " * n + ln for ln in text.splitlines())


def _branch(args: argparse.Namespace) -> int:
    from runlog.processors.branch import branch_run
    from runlog.processors.resume import load_app

    settings = Settings.from_env()
    bad = [i for i in args.input if "=" not in i or not i.partition("=")[0].strip()]
    if bad:
        raise ConfigError(f"--input wants NAME=VERSION, got {bad[0]!r}")
    changes = dict(i.split("=", 1) for i in args.input)
    res = branch_run(settings, load_app(args.app), args.run_id, changes)
    print(json.dumps(res.to_dict()) if args.json else res.describe())
    return EXIT_OK if res.completed else EXIT_FOUND


def _demo(args: argparse.Namespace) -> int:
    from runlog.processors.demo.run import DEFAULT_CRASH_AT, format_receipt, run_demo

    settings = Settings.from_env()
    t0 = time.monotonic()
    result = run_demo(settings, crash_at=args.crash_at or DEFAULT_CRASH_AT, quiet=args.json, sdk=args.sdk)
    result["seconds"] = round(time.monotonic() - t0, 2)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "timeline"}))
    else:
        print(format_receipt(result))
    ok = (result["completed"] and result["artifacts_equal_reference"]
          and all(result[k] == result["reference"][k] for k in ("publishes", "renders_billed",
                                                                "research_calls", "assets")))
    return EXIT_OK if ok else EXIT_FOUND
