"""Failures injected into a swap on Redis Cluster, at its per-slot moves.

:func:`fail_slot_moves` patches a client's ``pipeline`` so that the ``n``-th pipeline carrying the
swap script's forward moves (``lua/swap_slot.lua`` in its ``in`` form) fails:

* ``before``: the connection is lost before the pipeline is sent (nothing of it ran);
* ``after``: the pipeline ran and its reply was lost;
* ``vanished``: a rebuilt key its last slot should move in is deleted just before (that slot's script
  refuses and writes nothing, the other slots of the pipeline are moved);
* ``kill``: the pipeline ran, then the process is SIGKILLed (no roll-back, no clean-up: a crash).

Run as a program, it swaps with ``kill`` at the ``n``-th pipeline of one slot each (``chunk=1``), as
a separate process the tests can let die::

    python -m tests.integration.cluster._swap_hooks URL LIVE REBUILT N LOCK_TTL_MS
"""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from typing import Any

import redis

from runlog.projections._cluster_swap import SOURCE

SHA = hashlib.sha1(SOURCE.encode()).hexdigest()


class _Pipe:
    """A pipeline that records what is queued and calls ``on_execute`` instead of executing."""

    def __init__(self, pipe: Any, hooks: SlotFailures) -> None:
        self._pipe, self._hooks = pipe, hooks
        self.calls: list[tuple[Any, ...]] = []

    def execute_command(self, *args: Any, **kw: Any) -> Any:
        self.calls.append(args)
        return self._pipe.execute_command(*args, **kw)

    def execute(self, raise_on_error: bool = True) -> Any:
        return self._hooks.execute(self, raise_on_error)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pipe, name)


def _forward(call: tuple[Any, ...]) -> bool:
    """Whether a queued command is the swap script's ``in`` form."""
    if len(call) < 4 or call[0] != "EVALSHA" or call[1] != SHA:
        return False
    return bool(call[3 + int(call[2])] == "in")


class SlotFailures:
    """See the module docstring. ``forward`` counts the forward pipelines seen; ``vanished`` is the
    key deleted in ``vanished`` mode."""

    def __init__(self, client: Any, n: int, mode: str) -> None:
        self.client, self.n, self.mode = client, n, mode
        self.forward = 0
        self.vanished: str | None = None
        self._real = client.pipeline

    def execute(self, pipe: _Pipe, raise_on_error: bool) -> Any:
        if not any(_forward(c) for c in pipe.calls):
            return pipe._pipe.execute(raise_on_error=raise_on_error)
        self.forward += 1
        if self.forward != self.n:
            return pipe._pipe.execute(raise_on_error=raise_on_error)
        if self.mode == "before":
            pipe._pipe.reset()
            raise redis.ConnectionError("connection lost before the pipeline was sent")
        if self.mode == "vanished":
            call = [c for c in pipe.calls if _forward(c)][-1]  # the pipeline ends with its replica WAITs
            n_keys = int(call[2])
            keys, flags = call[3:3 + n_keys], call[4 + n_keys:]
            incoming = [keys[2 + 3 * j] for j, f in enumerate(flags) if f == "1"]
            assert incoming, "the slot moves nothing in"
            self.vanished = incoming[0]
            self.client.delete(self.vanished)
            return pipe._pipe.execute(raise_on_error=raise_on_error)
        pipe._pipe.execute(raise_on_error=raise_on_error)
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        raise redis.ConnectionError("connection lost after the pipeline ran")

    def pipeline(self, transaction: bool | None = None, shard_hint: Any = None) -> _Pipe:
        return _Pipe(self._real(transaction=transaction, shard_hint=shard_hint), self)


def fail_slot_moves(client: Any, n: int, mode: str) -> SlotFailures:
    """Patch ``client`` (a ``RedisCluster``; still one for :func:`runlog.schemas._redis.is_cluster`)."""
    hooks = SlotFailures(client, n, mode)
    client.pipeline = hooks.pipeline
    return hooks


def main(argv: list[str]) -> int:
    from runlog.projections import swap_namespaces
    from runlog.schemas._redis import redis_client
    from runlog.schemas.settings import Settings

    url, live, rebuilt, n, ttl = argv
    client = redis_client(Settings.from_env({}, redis_url=url, redis_prefix=live))
    fail_slot_moves(client, int(n), "kill")
    swap_namespaces(client, live, rebuilt, lock_ttl_ms=int(ttl), chunk=1)
    return 0  # fewer slots than n: the swap went through


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
