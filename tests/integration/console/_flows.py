"""Small workflows the console tests run in-process: one that completes with an effect, one that
fails, one held at a gate until the test opens it, one waiting for an approval."""

from __future__ import annotations

import contextlib
import threading
from typing import Any

from runlog.producers import CallInfo, DictInputSource, Runner, StageContext, Workflow, rule, tool
from runlog.schemas import ReplayPolicy, Settings

__all__ = ["approval", "completed", "failed", "gated"]


def _runner(settings: Settings) -> Runner:
    return Runner.from_settings(settings, source=DictInputSource({}))


def completed(settings: Settings, *, name: str = "alpha", q: str = "x") -> str:
    """A run of ``name`` through two stages (a lookup, then an effect with an external id)."""

    @tool("lookup")
    def lookup(call: CallInfo, q: str) -> Any:
        return {"answer": q.upper()}

    @tool("mail", policy=ReplayPolicy.IDEMPOTENT, effect=True, target="mail:outbox",
          delivery=lambda args, call: ("acct-console", "mail", args["to"], "1"))
    def mail(call: CallInfo, to: str, text: str) -> Any:
        return {"external_id": f"m-{to}"}

    wf = Workflow(name, "1")

    @wf.stage("fetch", rules=[rule("answer.set", lambda o: bool(o["answer"]))])
    def fetch(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"answer": ctx.call(lookup, q=ctx.params["q"])["answer"]}

    @wf.stage("send", rules=[rule("sent", lambda o: bool(o["mail"]))])
    def send(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        res = ctx.call(mail, to=ctx.params["q"], text=ctx.output_of("fetch")["answer"])
        return {"mail": res["external_id"]}

    with _runner(settings) as runner:
        result = runner.run(wf, {"q": q})
    assert result.completed
    return result.run_id


def failed(settings: Settings, *, name: str = "beta") -> str:
    """A run of ``name`` whose only stage raises (``FAILED``, terminal)."""
    wf = Workflow(name, "1")

    @wf.stage("boom")
    def boom(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        raise ValueError("the disk is full")

    with _runner(settings) as runner:
        h = runner.start_run(wf, {})
        assert h.session is not None
        with contextlib.suppress(ValueError):  # FAILED is on the log
            runner.execute(h.session)
    return h.run_id


def approval(settings: Settings, *, name: str = "gamma") -> str:
    """A run of ``name`` waiting for the signal ``approval`` (no lease, no thread held)."""
    wf = Workflow(name, "1")

    @wf.stage("ask")
    def ask(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"approved": ctx.wait_for("approval")}

    with _runner(settings) as runner:
        result = runner.run(wf, {})
    assert result.waiting == "approval", result
    return result.run_id


class Gated:
    """A run held inside its tool until :meth:`open` (run by :meth:`start` on a thread)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.run_id: str | None = None
        self.error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        @tool("hold")
        def hold(call: CallInfo) -> Any:
            self.entered.set()
            assert self.gate.wait(60), "the test never opened the gate"
            return {"held": True}

        wf = Workflow("gated", "1")

        @wf.stage("wait")
        def wait(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            return ctx.call(hold)  # type: ignore[no-any-return]

        try:
            with _runner(self.settings) as runner:
                h = runner.start_run(wf, {})
                self.run_id = h.run_id
                assert h.session is not None
                runner.execute(h.session)
        except BaseException as err:  # noqa: BLE001 - handed to the test's thread, which raises it
            self.error = err
            self.entered.set()

    def start(self) -> str:
        self._thread.start()
        assert self.entered.wait(60), "the gated run never reached its tool"
        assert self.error is None and self.run_id is not None, self.error
        return self.run_id

    def open(self) -> None:
        self.gate.set()
        self._thread.join(60)
        assert self.error is None, self.error


def gated(settings: Settings) -> Gated:
    return Gated(settings)
