"""What both runners hold: their start procedure and their stage execution, built from one set of
arguments (the sync and async runners are two faces driving the same parts' steps)."""

from __future__ import annotations

import dataclasses
from typing import Any

from runlog.producers.base._trace import NO_TRACE, Tracer
from runlog.producers.calls._artifacts import ArtifactStore
from runlog.producers.calls._ledger import EffectLedger
from runlog.producers.calls._limiter import Limiter
from runlog.producers.define._inputs import DictInputSource, InputSource
from runlog.producers.define._prices import PriceTable
from runlog.producers.log._lease import LeaseManager
from runlog.producers.log._log import EventLog
from runlog.producers.log._runlog import RunLog
from runlog.producers.run._active import ActiveRuns
from runlog.producers.run._children import ChildRuns
from runlog.producers.run._core import StageExecution
from runlog.producers.run._outcome import RunOutcomes
from runlog.producers.run._results import RunHandle
from runlog.producers.run._runs import RunKeyStore
from runlog.producers.run._start import RunStarts

__all__ = ["RunnerParts"]


class RunnerParts:
    """A runner's parts: :attr:`starts` (starting and taking over runs) and :attr:`stages` (executing
    their stages); the services they use read as the runner's attributes."""

    def __init__(self, writer: EventLog, leases: LeaseManager, store: ArtifactStore, *,
                 source: InputSource | None = None, run_keys: RunKeyStore | None = None,
                 max_parallel: int = 8, ledger: EffectLedger | None = None,
                 run_log: RunLog | None = None, lease_wait_s: float = 60.0,
                 active: ActiveRuns | None = None, tracer: Tracer = NO_TRACE,
                 prices: PriceTable | None = None, limiter: Limiter | None = None) -> None:
        self.starts = RunStarts(writer, leases, store, source or DictInputSource({}), run_keys=run_keys,
                                run_log=run_log, lease_wait_s=lease_wait_s, active=active, tracer=tracer)
        self.outcomes = RunOutcomes(run_log, store)
        """Where the handles this runner gives out wait for their runs' outcomes."""
        children = ChildRuns(self.starts, self.outcomes) if run_keys is not None else None
        self.stages = StageExecution(store, ledger=ledger, max_parallel=max_parallel, active=active,
                                     tracer=tracer, prices=PriceTable.of(prices), limiter=limiter,
                                     children=children)

    def handing_out(self, handle: RunHandle) -> RunHandle:
        """``handle`` able to wait for its run's outcome (:meth:`RunHandle.result`)."""
        return dataclasses.replace(handle, outcomes=self.outcomes)

    def watch_projection(self, client: Any, prefix: str) -> None:
        """Read awaited runs' states from the Redis projection under ``prefix`` first (the log when
        it lacks them)."""
        from runlog.projections import RedisStore

        self.outcomes.projected = RedisStore(client, prefix).load_state

    @property
    def writer(self) -> EventLog:
        return self.starts.writer

    @property
    def leases(self) -> LeaseManager:
        return self.starts.leases

    @property
    def store(self) -> ArtifactStore:
        return self.starts.store

    @property
    def source(self) -> InputSource:
        return self.starts.source

    @property
    def run_keys(self) -> RunKeyStore | None:
        return self.starts.run_keys

    @property
    def run_log(self) -> RunLog | None:
        return self.starts.run_log

    @property
    def lease_wait_s(self) -> float:
        return self.starts.lease_wait_s

    @property
    def active(self) -> ActiveRuns | None:
        return self.starts.active

    @property
    def tracer(self) -> Tracer:
        return self.starts.tracer

    @property
    def ledger(self) -> EffectLedger | None:
        """The effects ledger the stages' effect calls consult (settable: a runner's next stages use it)."""
        return self.stages.ledger

    @ledger.setter
    def ledger(self, ledger: EffectLedger | None) -> None:
        self.stages.ledger = ledger

    @property
    def max_parallel(self) -> int:
        return self.stages.max_parallel

    @property
    def prices(self) -> PriceTable:
        """Prices the model calls stages make (the App's ``prices``): a call's usage gets its cost."""
        return self.stages.prices
