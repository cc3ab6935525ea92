"""The SDK's unit tests on the in-memory adapters: a world of them with a runner (:class:`MemoryWorld`),
and what a resume does: read the recorded calls off a run's events, take the run over at a new epoch
and execute it again from its first stage."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from runlog.producers.calls._artifacts import InMemoryArtifactStore
from runlog.producers.calls._calls import RecordedCall
from runlog.producers.calls._ledger import InMemoryEffectLedger
from runlog.producers.define._inputs import DictInputSource, InputSource
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._memory import (
    InMemoryEventLog,
    InMemoryLeaseManager,
    InMemoryLeaseTable,
)
from runlog.producers.log._session import RunSession
from runlog.producers.run._arunner import AsyncRunner
from runlog.producers.run._results import RunResult
from runlog.producers.run._runner import Runner
from runlog.projections.fold import fold_all
from runlog.schemas import EventType, RunEvent


def recorded_calls(events: Sequence[RunEvent]) -> dict[str, RecordedCall]:
    """What a resume plan reads off the log: each call with its request hash and result."""
    out: dict[str, RecordedCall] = {}
    for e in events:
        if e.type is EventType.TOOL_CALLED and e.call_id:
            out[e.call_id] = RecordedCall(e.call_id, e.tool, e.request_hash)
        elif e.type is EventType.TOOL_RESULT and e.call_id and e.call_id in out:
            r = out[e.call_id]
            out[e.call_id] = RecordedCall(r.call_id, r.tool, r.request_hash, e.payload_ref)
    return out


def _take_over_args(events: Sequence[RunEvent], wf: Workflow, params: dict[str, Any]) -> dict[str, Any]:
    state = fold_all(list(events))
    assert state is not None
    return {"last_seq": state.last_seq, "workflow": wf, "input_versions": dict(state.input_versions),
            "params": params, "epoch": state.epoch, "last_hash": state.last_hash}


def again(runner: Runner, events: Sequence[RunEvent], wf: Workflow, params: dict[str, Any],
          **kw: Any) -> RunResult:
    """Take the run over (as resume does) and execute it from its first stage."""
    s: RunSession = runner.take_over(events[0].run_id, **_take_over_args(events, wf, params))
    return runner.execute(s, from_stage=wf.stages[0].name, **kw)


async def again_async(runner: AsyncRunner, events: Sequence[RunEvent], wf: Workflow, params: dict[str, Any],
                      **kw: Any) -> RunResult:
    """:func:`again` through the AsyncRunner."""
    s = await runner.take_over(events[0].run_id, **_take_over_args(events, wf, params))
    return await runner.execute(s, from_stage=wf.stages[0].name, **kw)


class MemoryWorld:
    """The in-memory adapters (event log, leases, artifacts, ledger) and a :class:`Runner` on them;
    :meth:`async_runner` gives an AsyncRunner sharing them."""

    def __init__(self, source: InputSource | None = None, **runner_kw: Any) -> None:
        self.source = source if source is not None else DictInputSource({})
        self.log = InMemoryEventLog(writer_id="w-test")
        self.table = InMemoryLeaseTable()
        self.store = InMemoryArtifactStore()
        self.ledger = InMemoryEffectLedger()
        self.runner = Runner(self.log, InMemoryLeaseManager(self.table, holder="w-test"), self.store,
                             source=self.source, ledger=self.ledger, run_log=self.log, **runner_kw)

    def async_runner(self, **kw: Any) -> AsyncRunner:
        return AsyncRunner(self.log, InMemoryLeaseManager(self.table, holder="w-test"), self.store,
                           source=self.source, ledger=self.ledger, run_log=self.log, **kw)

    def events(self, run_id: str) -> list[RunEvent]:
        return self.log.events(run_id)

    def recorded(self, run_id: str) -> dict[str, RecordedCall]:
        return recorded_calls(self.events(run_id))

    def again(self, run_id: str, wf: Workflow, params: dict[str, Any], **kw: Any) -> Any:
        """Take the run over at a new epoch (as resume does) and execute it from its first stage."""
        return again(self.runner, self.events(run_id), wf, params, **kw)
