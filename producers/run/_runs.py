"""Run idempotency keys: one key names at most one run, ever, and that run can always be found.

The run id of a keyed run is derived from the key (:func:`run_id_for_key`), so the
key-to-run mapping is a pure function and the log is the truth about whether the
run exists: no crash can leave a key pointing at a run id other than its own.

``{prefix}:runs:by_idempotency_key:<lp_sha256(key)>`` holds canonical JSON
``{"run_id", "params_hash", "workflow", "state"}`` (no TTL), where ``state`` is
``pending`` from the claim until the run's ``RUN_STARTED`` is acknowledged, then
``started``. The same key with the same workflow and params resolves to the run;
with anything else it is refused with :class:`~runlog.schemas.errors.RunConflict`. A
claim left ``pending`` by a crashed starter is settled by the next caller, which
takes the run's lease and reads the log (see :meth:`runlog.producers.Runner.start_run`).
Claims written before the ``state`` field existed read as ``started``.

Claims live only in Redis, so a Redis that lost its data (a restart without persistence, a
flush, a failover to an empty replica) would let a retried keyed start claim the key of a run
that exists on the log and start it a second time (its events fenced by the fold, but its tool
calls made again). A freshly made claim is therefore checked first (:meth:`RunKeys.known`): the
run's projected state says it exists; a ready projection namespace without it says it does not;
with no ready namespace (lost, being rebuilt, or no projector has run yet) the runner asks the log.

``aclaim`` / ``amark_started`` are the same calls for an event loop: with an asyncio
client they await the same round trips on it, without one they are the sync calls.
"""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from typing import Any, Protocol

import redis
import redis.asyncio

from runlog.producers.base._redis_io import RoundTrip, Steps, arun, replicated, run
from runlog.producers.calls._keys import canonical_json, lp_sha256
from runlog.projections.internal import READY, marker_key, parse_marker, state_key
from runlog.schemas.errors import RunConflict

__all__ = ["Claim", "InMemoryRunKeys", "RunKeyStore", "RunKeys", "run_id_for_key"]

PENDING, STARTED = "pending", "started"


def run_id_for_key(idempotency_key: str) -> str:
    """The run id a run idempotency key names: ``run-`` + 32 hex digits of a length-prefixed sha256."""
    return f"run-{lp_sha256('runlog.run', idempotency_key)[:32]}"


@dataclass(frozen=True, slots=True)
class Claim:
    """The state of a run idempotency key after :meth:`RunKeys.claim`."""

    run_id: str
    created: bool
    """This call made the claim (a new run)."""
    started: bool
    """The run's ``RUN_STARTED`` was acknowledged (as far as the claim knows)."""


_UNCLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RunKeys:
    """Claims run idempotency keys.

    Args:
        client: the sync connection.
        prefix: ``settings.redis_prefix``.
        aclient: an asyncio connection for ``aclaim`` / ``amark_started``.
    """

    def __init__(self, client: redis.Redis, prefix: str, *,
                 aclient: redis.asyncio.Redis | None = None, waits: Any = None) -> None:
        self._r = client
        self._ar = aclient
        self.prefix = prefix
        self.waits = waits
        """:func:`~runlog.producers.base._redis_io.replica_waits`: a claim is answered once a replica holds
        it."""
        self._unclaim = client.register_script(_UNCLAIM)

    def key(self, idempotency_key: str) -> str:
        return f"{self.prefix}:runs:by_idempotency_key:{lp_sha256(idempotency_key)}"

    @staticmethod
    def _value(run_id: str, params_hash: str, workflow: str, state: str = PENDING) -> bytes:
        return canonical_json({"run_id": run_id, "params_hash": params_hash, "workflow": workflow,
                               "state": state})

    # -- the protocol, once (see runlog.producers.base._redis_io); the sync and async faces drive it

    def _claimed(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Steps[Claim]:
        k, value = self.key(idempotency_key), self._value(run_id, params_hash, workflow)
        while True:
            if (yield from replicated(RoundTrip(lambda c: c.set(k, value, nx=True)),
                                      lambda p: p.set(k, value, nx=True), [k], self.waits, self._r)):
                return Claim(run_id, True, False)
            raw = yield from RoundTrip(lambda c: c.get(k))
            if raw is not None:  # else deleted in between: try again
                break
        found = json.loads(raw)
        if found["workflow"] != workflow:
            raise RunConflict(idempotency_key, found["run_id"],
                              f"it was started for workflow {found['workflow']}, not {workflow}")
        if found["params_hash"] != params_hash:
            raise RunConflict(idempotency_key, found["run_id"],
                              f"it was started with params sha256 {found['params_hash']}, these hash to "
                              f"{params_hash}; use a new key for new parameters")
        return Claim(str(found["run_id"]), False, found.get("state", STARTED) != PENDING)

    def _started(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Steps[None]:
        k, value = self.key(idempotency_key), self._value(run_id, params_hash, workflow, STARTED)
        yield from RoundTrip(lambda c: c.set(k, value))

    def claim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Claim:
        """Claim the key for ``run_id`` (``pending``), or read the existing claim.

        Raises:
            RunConflict: the key names a run of another workflow or other params.
        """
        return run(self._claimed(idempotency_key, run_id, params_hash, workflow), self._r)

    async def aclaim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Claim:
        """:meth:`claim` for an event loop."""
        return await arun(self._claimed(idempotency_key, run_id, params_hash, workflow), self._ar, self._r)

    def mark_started(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> None:
        """The run's ``RUN_STARTED`` is on the log: the claim is settled for good."""
        run(self._started(idempotency_key, run_id, params_hash, workflow), self._r)

    async def amark_started(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> None:
        """:meth:`mark_started` for an event loop."""
        await arun(self._started(idempotency_key, run_id, params_hash, workflow), self._ar, self._r)

    def _known(self, run_id: str) -> Steps[bool | None]:
        if (yield from RoundTrip(lambda c: c.exists(state_key(self.prefix, run_id)))):
            return True
        marker = parse_marker((yield from RoundTrip(lambda c: c.hgetall(marker_key(self.prefix)))))
        return False if marker is not None and marker.state == READY else None

    def known(self, run_id: str) -> bool | None:
        """Whether ``run_id`` exists, as far as the projection tells: True (its state is projected),
        False (the namespace is ready and holds no state for it), None (no ready namespace: Redis
        lost its data, a rebuild is running, or no projector has written one; ask the log)."""
        return run(self._known(run_id), self._r)

    async def aknown(self, run_id: str) -> bool | None:
        """:meth:`known`, awaited."""
        return await arun(self._known(run_id), self._ar, self._r)

    def unclaim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> None:
        """Drop a ``pending`` claim whose run certainly never appended anything (compare-and-delete)."""
        self._unclaim(keys=[self.key(idempotency_key)], args=[self._value(run_id, params_hash, workflow)])


class RunKeyStore(Protocol):
    """What a keyed start needs of the run key store (:class:`RunKeys` in Redis, :class:`InMemoryRunKeys`)."""

    def claim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Claim: ...

    async def aclaim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Claim: ...

    def mark_started(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> None: ...

    async def amark_started(self, idempotency_key: str, run_id: str, params_hash: str,
                            workflow: str) -> None: ...

    def known(self, run_id: str) -> bool | None: ...

    async def aknown(self, run_id: str) -> bool | None: ...


class InMemoryRunKeys:
    """:class:`RunKeys` in a dict (tests, one process): the same claims and refusals. ``known`` answers
    None (no projection to ask), so a fresh claim is checked on the log, as with a Redis that lost
    its projection."""

    def __init__(self) -> None:
        self._claims: dict[str, dict[str, str]] = {}
        self._lock = threading.Lock()

    def claim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Claim:
        """:meth:`RunKeys.claim`."""
        with self._lock:
            found = self._claims.get(idempotency_key)
            if found is None:
                self._claims[idempotency_key] = {"run_id": run_id, "params_hash": params_hash,
                                                 "workflow": workflow, "state": PENDING}
                return Claim(run_id, True, False)
        if found["workflow"] != workflow:
            raise RunConflict(idempotency_key, found["run_id"],
                              f"it was started for workflow {found['workflow']}, not {workflow}")
        if found["params_hash"] != params_hash:
            raise RunConflict(idempotency_key, found["run_id"],
                              f"it was started with params sha256 {found['params_hash']}, these hash to "
                              f"{params_hash}; use a new key for new parameters")
        return Claim(found["run_id"], False, found["state"] != PENDING)

    async def aclaim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> Claim:
        return self.claim(idempotency_key, run_id, params_hash, workflow)

    def mark_started(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> None:
        with self._lock:
            self._claims[idempotency_key] = {"run_id": run_id, "params_hash": params_hash,
                                             "workflow": workflow, "state": STARTED}

    async def amark_started(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> None:
        self.mark_started(idempotency_key, run_id, params_hash, workflow)

    def known(self, run_id: str) -> bool | None:
        return None

    async def aknown(self, run_id: str) -> bool | None:
        return None
