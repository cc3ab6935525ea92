"""The asyncio runner: the same protocol steps as :class:`~runlog.producers.Runner`, awaited on the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from concurrent.futures import Executor, ThreadPoolExecutor
from typing import Any

import redis.asyncio as aredis

from runlog.producers.base._protocol import (
    LoopMode,
    ThreadMode,
    adrive,
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
from runlog.producers.log._lease import AsyncRedisLeaseManager, LeaseManager
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
from runlog.schemas import ArtifactRef, Codec, ResumeRequest, RunEvent, StreamRecord
from runlog.schemas.errors import LogUnavailable
from runlog.schemas.internal import aredis_client, redis_client
from runlog.schemas.settings import Settings

__all__ = ["AsyncRunner"]


class AsyncRunner(RunnerParts):
    """The asyncio form of :class:`Runner`: the same protocol steps, awaited on the running loop.

    Thousands of runs share one loop and one writer: confirmed appends are awaited (the writer's
    poll thread sends them at once and completes their futures), Redis round trips use redis-py's
    asyncio client; lease heartbeats are one thread with its own connection (a loop busy with
    thousands of runs must not delay them). ``async def`` stages and tools run
    on the loop; a ``def`` stage runs on a worker thread (its ``ctx.call`` hops onto the loop for
    every append and round trip), a ``def`` tool in an ``async def`` stage on ``executor``.

    Args:
        like :class:`Runner`, plus
        executor: the pool for ``def`` stages and tools (default: one of ``max_threads`` threads).
    """

    def __init__(self, writer: EventLog, leases: LeaseManager, store: ArtifactStore, *,
                 source: InputSource | None = None, run_keys: RunKeyStore | None = None,
                 max_parallel: int = 8, ledger: EffectLedger | None = None,
                 run_log: RunLog | None = None, lease_wait_s: float = 60.0,
                 active: ActiveRuns | None = None, tracer: Tracer = NO_TRACE,
                 executor: Executor | None = None, max_threads: int = 32,
                 prices: PriceTable | Mapping[str, Price] | None = None,
                 limiter: Limiter | None = None) -> None:
        super().__init__(writer, leases, store, source=source, run_keys=run_keys, max_parallel=max_parallel,
                         ledger=ledger, run_log=run_log, lease_wait_s=lease_wait_s, active=active,
                         tracer=tracer, prices=PriceTable.of(prices), limiter=limiter)
        self._own_executor = executor is None
        self.executor = executor or ThreadPoolExecutor(max_threads, thread_name_prefix="runlog-async")
        self._loop_mode = LoopMode(self.executor)
        self._owned: list[Any] = []
        self._schemas: asyncio.Future[None] | None = None

    @classmethod
    def from_settings(cls, settings: Settings, *, source: InputSource | None = None,
                      writer: EventLog | None = None, store: ArtifactStore | None = None,
                      tracer: Tracer = NO_TRACE, max_connections: int = 256,
                      pool_timeout: float | None = None, metrics_registry: Any = None,
                      prices: PriceTable | Mapping[str, Price] | None = None) -> AsyncRunner:
        """An async runner on the real services (Redis via redis-py's asyncio client).

        ``max_connections``: the asyncio pool the runs share; a run waits for a free connection up
        to ``pool_timeout`` seconds (None, the default: as long as it takes, since waiting there
        is queueing behind other runs, not a failure; a Redis that stops answering is bounded by
        the URL's ``socket_timeout``, as for every other client). ``metrics_registry``: a
        ``prometheus_client.CollectorRegistry`` its own writer counts into."""
        client = redis_client(settings, max_connections=16, timeout=30)
        aclient = aredis_client(settings, max_connections=max_connections, timeout=pool_timeout)
        beat = redis_client(settings, max_connections=2, timeout=30)  # the heartbeat thread's own
        own_writer = writer is None
        w = writer or RunWriter(settings, metrics_registry=metrics_registry)
        waits = replica_waits(client, settings)  # durable claims wait for a replica where there is one
        topic = EffectsTopic(settings)  # the ledger's source when Redis lost its claims and projection
        leases = AsyncRedisLeaseManager(client, aclient, settings, holder=w.writer_id, heartbeat_client=beat,
                                        waits=waits)
        store = sealing(store, settings) if store is not None else store_from_settings(settings)
        r = cls(w, leases, store, source=source,
                run_keys=RunKeys(client, settings.redis_prefix, aclient=aclient, waits=waits),
                ledger=RedisEffectLedger(client, settings.redis_prefix, aclient=aclient, waits=waits,
                                         effects_topic=topic),
                run_log=KafkaRunLog(settings), lease_wait_s=settings.lease_ttl_ms / 1000 + 5,
                active=ActiveRuns(client, settings.redis_prefix, aclient=aclient), tracer=tracer,
                prices=prices, limiter=RedisLimiter(client, settings.redis_prefix,
                                                    durable_after_s=settings.limit_durable_wait_ms / 1000))
        r.watch_projection(client, settings.redis_prefix)
        r._owned = [topic, beat, leases, client, aclient] + ([w] if own_writer else [])
        return r

    async def aclose(self) -> None:
        """Close what :meth:`from_settings` created (flushes the writer off the loop)."""
        for x in reversed(self._owned):
            if isinstance(x, LeaseManager):
                await x.aclose()
            elif isinstance(x, aredis.Redis):
                await x.aclose(close_connection_pool=True)
            elif isinstance(x, aredis.RedisCluster):
                await x.aclose()
            elif isinstance(x, EventLog):
                await asyncio.to_thread(x.close)
            else:
                x.close()
        self._owned = []
        if self._own_executor:
            self.executor.shutdown(wait=False)

    async def __aenter__(self) -> AsyncRunner:
        await self._writer_schemas()
        return self

    async def _writer_schemas(self) -> None:
        # The first encode of an event (a resume request, a stream record) publishes its writer
        # schema (the schema log) and waits for the broker's acknowledgement: on the loop, a stall
        # of every run sharing it (about half a second on a busy host). Published once on a thread,
        # before the first run starts or is taken over (the schema log is the process's: the
        # stream writer's codec finds them published); the runs that come meanwhile wait for it
        # without holding the loop.
        codec = getattr(self.writer, "codec", None)
        if not isinstance(codec, Codec):
            return
        done = self._schemas
        if done is not None and (done.cancelled() or done.get_loop() is not asyncio.get_running_loop()):
            done = self._schemas = None  # cancelled as its loop ended: this loop publishes again
        if done is None:
            written = (RunEvent, ResumeRequest, StreamRecord)
            done = self._schemas = asyncio.ensure_future(
                asyncio.to_thread(codec.publish_writer_schemas, *written))
        try:
            await asyncio.shield(done)
        except asyncio.CancelledError:
            if done.cancelled() and self._schemas is done:
                self._schemas = None
            raise
        except Exception as err:
            if self._schemas is done:
                self._schemas = None  # tried again by the next run, not failed for good
            if not isinstance(err, LogUnavailable):
                raise
            # the broker did not acknowledge it: the first append tries again and reports it

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def start_run(self, workflow: Workflow, params: Mapping[str, Any],
                        inputs: Mapping[str, str] | None = None, idempotency_key: str | None = None, *,
                        parent_run_id: str | None = None, forked_from_seq: int | None = None,
                        budget: Budget | None = None, attributes: Mapping[str, str] | None = None,
                        subject: str | None = None) -> RunHandle:
        await self._writer_schemas()
        return self.handing_out(await adrive(self.starts.start(workflow, params, inputs, idempotency_key,
                                                               parent_run_id, forked_from_seq, budget,
                                                               attributes, subject),
                                             self._loop_mode))

    start_run.__doc__ = _START_DOC

    async def mark_inactive(self, run_id: str) -> None:
        """Drop a run from the active-runs registry (it completed, blocked or failed)."""
        await adrive(deactivating(self.active, run_id), self._loop_mode)

    async def run(self, workflow: Workflow, params: Mapping[str, Any],
                  inputs: Mapping[str, str] | None = None, idempotency_key: str | None = None, *,
                  subject: str | None = None) -> RunResult:
        """Start a run and execute all its stages (see :meth:`Runner.run`)."""
        h = await self.start_run(workflow, params, inputs, idempotency_key, subject=subject)
        if h.session is None:
            return await self.outcomes.aresult(h.run_id, settle_on_wait=True)
        return await self.execute(h.session)

    async def take_over(self, run_id: str, *, last_seq: int, workflow: Workflow,
                        input_versions: Mapping[str, str], params: Mapping[str, Any], epoch: int = 0,
                        force: bool = False, last_hash: str | None = None,
                        attributes: Mapping[str, str] | None = None,
                        subject: str | None = None) -> RunSession:
        """:meth:`Runner.take_over`, awaited."""
        await self._writer_schemas()
        return await adrive(self.starts.take_over(run_id, last_seq=last_seq, workflow=workflow,
                                                  input_versions=input_versions, params=params,
                                                  epoch=epoch, force=force, last_hash=last_hash,
                                                  attributes=attributes, subject=subject), self._loop_mode)

    async def execute(self, session: RunSession, *, from_stage: str | None = None,
                      stage_outputs: Mapping[str, Mapping[str, Any] | ArtifactRef] | None = None,
                      recorded_calls: Mapping[str, RecordedCall | ArtifactRef] | None = None,
                      reconciled: Mapping[str, Mapping[str, Any]] | None = None,
                      complete: bool = True, release: bool = True,
                      deadlines: Mapping[str, int] | None = None) -> RunResult:
        modes = (ThreadMode(asyncio.get_running_loop()), self._loop_mode)
        return await adrive(self.stages.execute(session, from_stage, stage_outputs, recorded_calls,
                                                reconciled, complete, release, deadlines, modes),
                            self._loop_mode)

    execute.__doc__ = _EXECUTE_DOC
