"""The blocking runner: starts runs and executes their stages on the caller's thread."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from typing import Any

import redis

from runlog.producers.base._protocol import (
    INLINE,
    SYNC,
    drive,
)
from runlog.producers.base._redis_io import replica_waits
from runlog.producers.base._trace import NO_TRACE, Tracer
from runlog.producers.calls._artifacts import ArtifactStore
from runlog.producers.calls._calls import RecordedCall
from runlog.producers.calls._ledger import EffectLedger, RedisEffectLedger
from runlog.producers.calls._ledger_topic import EffectsTopic
from runlog.producers.calls._limiter import Limiter, RedisLimiter
from runlog.producers.calls._sealed import sealing, store_from_settings
from runlog.producers.define._budget import Budget
from runlog.producers.define._inputs import InputSource
from runlog.producers.define._prices import Price, PriceTable
from runlog.producers.define._workflow import Workflow
from runlog.producers.log._lease import LeaseManager, RedisLeaseManager
from runlog.producers.log._log import EventLog
from runlog.producers.log._runlog import KafkaRunLog, RunLog
from runlog.producers.log._session import RunSession
from runlog.producers.log._writer import RunWriter
from runlog.producers.run._active import ActiveRuns
from runlog.producers.run._core import _EXECUTE_DOC
from runlog.producers.run._results import RunHandle, RunResult
from runlog.producers.run._runner_parts import RunnerParts
from runlog.producers.run._runs import RunKeys, RunKeyStore
from runlog.producers.run._start import _START_DOC, deactivating
from runlog.schemas import ArtifactRef
from runlog.schemas.internal import redis_client
from runlog.schemas.settings import Settings

__all__ = ["Runner"]


class Runner(RunnerParts):
    """Starts runs and executes stages, blocking the caller; thread-safe, one per process is enough.

    ``def`` stages run on the calling thread (``ctx.submit`` / ``ctx.parallel`` on a thread pool);
    an ``async def`` stage runs on a private event loop for its duration.

    Args:
        writer: the shared producer.
        leases: where leases come from (Redis in production).
        store: the artifact store.
        source: where versioned inputs come from (empty when None).
        run_keys: the run idempotency-key store (required to pass ``idempotency_key``).
        max_parallel: threads per stage for ``ctx.submit`` / ``ctx.parallel``.
        ledger: the effects ledger shared by all runs (consulted before every effect).
        run_log: reads a run's first event back (settles interrupted keyed starts).
        lease_wait_s: how long a keyed start waits for a crashed starter's lease to expire.
        active: the registry of active runs the resumers' sweep reads (no projector needed).
        tracer: spans per run, stage and call (``runlog.producers.otel.OtelTracer``; none by default).
        prices: the price table of the model calls its stages make (the App's ``prices``): each
            call's recorded usage gets its cost (none for a model without a price).
        limiter: counts the calls of tools with a rate limit (:attr:`Tool.limit`); ``from_settings``
            gives the fleet's, in Redis. None: limits are not counted.
    """

    def __init__(self, writer: EventLog, leases: LeaseManager, store: ArtifactStore, *,
                 source: InputSource | None = None, run_keys: RunKeyStore | None = None,
                 max_parallel: int = 8, ledger: EffectLedger | None = None,
                 run_log: RunLog | None = None, lease_wait_s: float = 60.0,
                 active: ActiveRuns | None = None, tracer: Tracer = NO_TRACE,
                 prices: PriceTable | Mapping[str, Price] | None = None,
                 limiter: Limiter | None = None) -> None:
        super().__init__(writer, leases, store, source=source, run_keys=run_keys, max_parallel=max_parallel,
                         ledger=ledger, run_log=run_log, lease_wait_s=lease_wait_s, active=active,
                         tracer=tracer, prices=PriceTable.of(prices), limiter=limiter)
        self._owned: list[Any] = []

    @classmethod
    def from_settings(cls, settings: Settings, *, source: InputSource | None = None,
                      writer: EventLog | None = None, store: ArtifactStore | None = None,
                      tracer: Tracer = NO_TRACE, metrics_registry: Any = None,
                      prices: PriceTable | Mapping[str, Price] | None = None) -> Runner:
        """A runner on the real services: Redis leases and run keys, the local artifact store.
        ``metrics_registry``: a ``prometheus_client.CollectorRegistry`` its own writer counts into."""
        # Blocking pool: many run threads share a bounded set of connections and wait for one.
        client = redis_client(settings, max_connections=64, timeout=30)
        own_writer = writer is None
        w = writer or RunWriter(settings, metrics_registry=metrics_registry)
        beat = redis_client(settings, max_connections=2, timeout=30)  # never behind the run threads
        waits = replica_waits(client, settings)  # durable claims wait for a replica where there is one
        topic = EffectsTopic(settings)  # the ledger's source when Redis lost its claims and projection
        leases = RedisLeaseManager(client, settings, holder=w.writer_id, heartbeat_client=beat, waits=waits)
        store = sealing(store, settings) if store is not None else store_from_settings(settings)
        r = cls(w, leases, store, source=source,
                run_keys=RunKeys(client, settings.redis_prefix, waits=waits),
                ledger=RedisEffectLedger(client, settings.redis_prefix, waits=waits, effects_topic=topic),
                run_log=KafkaRunLog(settings),
                lease_wait_s=settings.lease_ttl_ms / 1000 + 5,
                active=ActiveRuns(client, settings.redis_prefix), tracer=tracer, prices=prices,
                limiter=RedisLimiter(client, settings.redis_prefix,
                                     durable_after_s=settings.limit_durable_wait_ms / 1000))
        r.watch_projection(client, settings.redis_prefix)
        r._owned = [topic, beat, leases, client] + ([w] if own_writer else [])
        return r

    def close(self) -> None:
        """Close what :meth:`from_settings` created (flushes the writer)."""
        for x in reversed(self._owned):
            x.close()
        self._owned = []

    def __enter__(self) -> Runner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start_run(self, workflow: Workflow, params: Mapping[str, Any],
                  inputs: Mapping[str, str] | None = None, idempotency_key: str | None = None, *,
                  parent_run_id: str | None = None, forked_from_seq: int | None = None,
                  budget: Budget | None = None, attributes: Mapping[str, str] | None = None,
                  subject: str | None = None) -> RunHandle:
        return self.handing_out(drive(self.starts.start(workflow, params, inputs, idempotency_key,
                                                        parent_run_id, forked_from_seq, budget, attributes,
                                                        subject)))

    start_run.__doc__ = _START_DOC

    def mark_inactive(self, run_id: str) -> None:
        """Drop a run from the active-runs registry (it completed, blocked or failed)."""
        drive(deactivating(self.active, run_id))

    def mark_waiting(self, run_id: str, workflow_name: str, deadline_ms: int) -> None:
        """Keep a run that waits with a deadline (a sleep, a wait's timeout) in the waiting set, so the
        resumers wake it at ``deadline_ms`` (a writer that died before it got there left it out)."""
        if self.active is not None and deadline_ms > 0:
            with contextlib.suppress(redis.RedisError):  # the resumers re-arm it from the projection
                self.active.wait(run_id, workflow_name, deadline_ms)

    def run(self, workflow: Workflow, params: Mapping[str, Any], inputs: Mapping[str, str] | None = None,
            idempotency_key: str | None = None, *, subject: str | None = None) -> RunResult:
        """Start a run and execute all its stages. For a key naming an existing run, the outcome of
        that run, wherever it executes (:meth:`RunHandle.result`; a run that waits for a signal
        returns with ``waiting`` set, as a run started here does).

        ``subject``: the tenant or customer id whose data key encrypts the run's payloads when
        ``RUNLOG_ENCRYPTION`` is on (recorded as the ``RUN_STARTED`` attribute ``runlog.subject``; an
        opaque id, readable on the log). None: the default subject. ``runlog erase --subject`` destroys
        that key.

        Raises:
            RunConflict: the key names a run of another workflow or other parameters.
            RunFailed, ResumeBlocked, RunCancelled: the existing run ended so.
        """
        h = self.start_run(workflow, params, inputs, idempotency_key, subject=subject)
        if h.session is None:
            return self.outcomes.result(h.run_id, settle_on_wait=True)
        return self.execute(h.session)

    def take_over(self, run_id: str, *, last_seq: int, workflow: Workflow,
                  input_versions: Mapping[str, str], params: Mapping[str, Any], epoch: int = 0,
                  force: bool = False, last_hash: str | None = None,
                  attributes: Mapping[str, str] | None = None, subject: str | None = None) -> RunSession:
        """:meth:`RunSession.take_over` with this runner's writer, leases and input source."""
        return drive(self.starts.take_over(run_id, last_seq=last_seq, workflow=workflow,
                                           input_versions=input_versions, params=params,
                                           epoch=epoch, force=force, last_hash=last_hash,
                                           attributes=attributes, subject=subject))

    def execute(self, session: RunSession, *, from_stage: str | None = None,
                stage_outputs: Mapping[str, Mapping[str, Any] | ArtifactRef] | None = None,
                recorded_calls: Mapping[str, RecordedCall | ArtifactRef] | None = None,
                reconciled: Mapping[str, Mapping[str, Any]] | None = None,
                complete: bool = True, release: bool = True,
                deadlines: Mapping[str, int] | None = None) -> RunResult:
        return drive(self.stages.execute(session, from_stage, stage_outputs, recorded_calls, reconciled,
                                         complete, release, deadlines, (SYNC, INLINE)))

    execute.__doc__ = _EXECUTE_DOC

