"""The two faces of the SDK's Redis ports, for contracts that run every case on both.

A case is an ``async def`` body that calls the port only through a :class:`Face`:

* :data:`SYNC` calls ``acquire`` / ``verify`` / ``release`` / ``open`` / ``close`` and runs
  the body with no event loop at all (it must finish without ever suspending);
* :data:`ASYNC` awaits ``aacquire`` / ``averify`` / ``arelease`` / ``aopen`` /
  ``aclose_effect`` in ``asyncio.run``, then awaits the contract's ``aclean`` on that loop
  (where adapters close their asyncio clients).

So one case states what both faces must do, and the async face is held to the sync one.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, Protocol, TypeVar

import redis.asyncio

from runlog.producers.calls._ledger import EffectLedger, LedgerEntry
from runlog.producers.log._lease import Lease, LeaseManager
from runlog.schemas import EffectStatus

Body = Callable[[], Coroutine[Any, Any, None]]


class _Closable(Protocol):
    async def aclose(self) -> None: ...


C = TypeVar("C", bound=_Closable)


class OnLoop:
    """An asyncio Redis client for one test: :meth:`run` awaits a body in ``asyncio.run``, then
    closes, on that loop, what :meth:`closing` was given (last first) and the client."""

    def __init__(self, redis_url: str) -> None:
        self.aclient = redis.asyncio.Redis.from_url(redis_url)
        self._closers: list[Callable[[], Awaitable[None]]] = [self.aclient.aclose]

    def closing(self, x: C) -> C:
        self._closers.append(x.aclose)
        return x

    def run(self, body: Body) -> None:
        async def main() -> None:
            try:
                await body()
            finally:
                for close in reversed(self._closers):
                    await close()

        asyncio.run(main())


class Face:
    name = ""

    def __repr__(self) -> str:
        return self.name

    def run(self, body: Body, aclean: Callable[[], Awaitable[None]]) -> None:
        raise NotImplementedError

    async def acquire(self, m: LeaseManager, run_id: str, *, force: bool = False,
                      epoch: int = 0) -> Lease:
        raise NotImplementedError

    async def verify(self, lease: Lease) -> None:
        raise NotImplementedError

    async def release(self, lease: Lease) -> None:
        raise NotImplementedError

    async def open(self, ledger: EffectLedger, entry: LedgerEntry) -> LedgerEntry | None:
        raise NotImplementedError

    async def close(self, ledger: EffectLedger, delivery_key: str, run_id: str, call_id: str | None,
                    status: EffectStatus, external_id: str | None = None) -> None:
        raise NotImplementedError


class _Sync(Face):
    name = "sync"

    def run(self, body: Body, aclean: Callable[[], Awaitable[None]]) -> None:
        coro = body()
        try:
            coro.send(None)
        except StopIteration:
            return
        coro.close()
        raise AssertionError("the sync face suspended: it must not need an event loop")

    async def acquire(self, m: LeaseManager, run_id: str, *, force: bool = False,
                      epoch: int = 0) -> Lease:
        return m.acquire(run_id, force=force, epoch=epoch)

    async def verify(self, lease: Lease) -> None:
        lease.verify()

    async def release(self, lease: Lease) -> None:
        lease.release()

    async def open(self, ledger: EffectLedger, entry: LedgerEntry) -> LedgerEntry | None:
        return ledger.open(entry)

    async def close(self, ledger: EffectLedger, delivery_key: str, run_id: str, call_id: str | None,
                    status: EffectStatus, external_id: str | None = None) -> None:
        ledger.close(delivery_key, run_id, call_id, status, external_id)


class _Async(Face):
    name = "async"

    def run(self, body: Body, aclean: Callable[[], Awaitable[None]]) -> None:
        async def main() -> None:
            try:
                await body()
            finally:
                await aclean()

        asyncio.run(main())

    async def acquire(self, m: LeaseManager, run_id: str, *, force: bool = False,
                      epoch: int = 0) -> Lease:
        return await m.aacquire(run_id, force=force, epoch=epoch)

    async def verify(self, lease: Lease) -> None:
        await lease.averify()

    async def release(self, lease: Lease) -> None:
        await lease.arelease()

    async def open(self, ledger: EffectLedger, entry: LedgerEntry) -> LedgerEntry | None:
        return await ledger.aopen(entry)

    async def close(self, ledger: EffectLedger, delivery_key: str, run_id: str, call_id: str | None,
                    status: EffectStatus, external_id: str | None = None) -> None:
        await ledger.aclose_effect(delivery_key, run_id, call_id, status, external_id)


SYNC: Face = _Sync()
ASYNC: Face = _Async()
FACES = [SYNC, ASYNC]
