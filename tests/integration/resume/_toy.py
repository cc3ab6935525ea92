"""Toy Apps for the resumer routing tests: one two-stage workflow each, crashed in-process.

A toy run "crashes" in its second stage after one tool call: the stage raises
:class:`Abandon` (a ``BaseException``, so the runner appends no ``FAILED``), the session
is flushed without releasing its lease, and the runner stops heartbeating: the lease then
expires after its ttl, exactly as when a worker is SIGKILLed.
"""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import Consumer

from runlog.processors.resume import App
from runlog.producers import DictInputSource, Runner, Tool, Workflow, rule, tool
from runlog.schemas import Settings, Topics
from tests.integration.producers.helpers import watermarks


class Abandon(BaseException):
    """Stops a toy run in the middle of a stage, like a crash (nothing more is appended)."""


@dataclass
class Toy:
    """One workflow ``name`` in an App of its own; ``calls`` counts every real tool execution."""

    name: str
    workflow: Workflow
    tools: tuple[Tool, ...]
    calls: Counter[str] = field(default_factory=Counter)
    crashing: bool = True

    def app(self, *, name: str | None = None, also: tuple[Toy, ...] = ()) -> App:
        wfs = [self.workflow, *(t.workflow for t in also)]
        tools = [*self.tools, *(x for t in also for x in t.tools)]
        return App.of(wfs, tools, DictInputSource({}), name=name)


def toy(name: str) -> Toy:
    """A workflow ``name`` with stages ``gather`` (tool ``<name>_lookup``) and ``finish``
    (tool ``<name>_render``, then :class:`Abandon` while ``crashing``)."""
    wf = Workflow(name, "1")

    @tool(f"{name}_lookup")
    def lookup(call: Any, q: str) -> dict[str, Any]:
        t.calls["lookup"] += 1
        return {"answer": f"{name}:{q}"}

    @tool(f"{name}_render")
    def render(call: Any, text: str) -> dict[str, Any]:
        t.calls["render"] += 1
        return {"text": text.upper()}

    t = Toy(name, wf, (lookup, render))

    @wf.stage("gather", rules=[rule("answer.set", lambda o: bool(o.get("answer")))])
    def gather(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answer": ctx.call(lookup, q=ctx.params["q"])["answer"]}

    @wf.stage("finish", rules=[rule("text.upper", lambda o: o.get("text", "").isupper())])
    def finish(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        out = ctx.call(render, text=ctx.output_of("gather")["answer"])
        if t.crashing:
            raise Abandon(f"{name}: crashed in finish")
        return {"text": out["text"]}

    return t


def failing(name: str) -> tuple[Workflow, Tool]:
    """A one-stage workflow whose tool raises an error carrying the run's parameter ``q``."""
    wf = Workflow(name, "1")

    @tool(f"{name}_charge")
    def charge(call: Any, q: str) -> dict[str, Any]:
        raise ValueError(f"card of {q} declined")

    @wf.stage("pay")
    def pay(ctx: Any, inputs: dict[str, Any]) -> dict[str, Any]:
        return dict(ctx.call(charge, q=ctx.params["q"]))

    return wf, charge


def crash(settings: Settings, t: Toy, q: str = "x") -> str:
    """Start a run of ``t`` and crash it in ``finish`` (its lease is left to expire); its run id."""
    t.crashing = True
    runner = Runner.from_settings(settings, source=DictInputSource({}))
    try:
        h = runner.start_run(t.workflow, {"q": q})
        assert h.session is not None
        try:
            runner.execute(h.session, release=False)
        except Abandon:
            pass
        else:  # pragma: no cover - the stage always raises while crashing
            raise AssertionError("the toy run did not crash")
    finally:
        runner.close()  # stops the heartbeat: the lease expires after its ttl
        t.crashing = False
    return h.run_id


def wait_events_topic_ready(settings: Settings) -> None:
    """Wait until every partition of a just created events topic has a leader."""
    topic = Topics.of(settings).events
    c = Consumer(settings.consumer_config(f"t-ready-{uuid.uuid4().hex[:8]}"))
    try:
        for p in c.list_topics(topic, timeout=10).topics[topic].partitions:
            watermarks(c, topic, p)
    finally:
        c.close()
