"""Waiting for replicas before an apply returns, so an acknowledged batch survives a failover.

Redis replicates asynchronously: a master answers a write before any replica has it, and when it
is killed and a replica promoted, what it acknowledged but had not sent is gone. The projector
commits a batch's Kafka offsets once :meth:`~runlog.projections.redis_store.RedisStore.apply` returns, so
a write lost that way is never redone. A lost run state is detected afterwards
(:class:`~runlog.projections.store.StoreWentBack`), a lost global-index write (a run left listed RUNNING)
is not; so an apply first waits, with Redis ``WAIT numreplicas timeout``, until the writes are on
replicas of every primary it wrote to.

``WAIT`` blocks until the replicas acknowledge the replication offset of *the connection it is sent
on*, as of that connection's last write: it says nothing about a connection that wrote nothing. So
the waits are queued at the end of the very pipeline that carries the writes, one per node
(``target_nodes``): redis-py's cluster pipeline sends each node's commands, in order, on one
connection. When that pipeline took one of redis-py's detours (a command retried alone after a
``MOVED`` or a lost connection, or the whole pipeline sent again after the slot map was reloaded),
a write may have gone over another connection, or a wait to another node: the waits prove nothing
then, and the apply fails (:class:`~runlog.projections._sharded.ProjectionStoreError`, retried by the
projector) rather than pass unproven.

How many replicas (``RUNLOG_REDIS_WAIT_REPLICAS``, :attr:`ReplicaWaits.replicas`): None ("auto") on
a cluster waits for one replica on each primary written to that has one online (a primary with
none, such as a promoted replica whose old master is dead, is written to without a wait and named
in a warning once: stalling the projector would not bring its replica back); 0 never waits; N waits
for N on every primary written to, the standalone server too (where "auto" never waits).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import redis

from runlog.projections._sharded import ProjectionStoreError

__all__ = ["CHECK_EVERY_S", "ReplicaWaits", "ReplicasBehind", "online_replicas"]

log = logging.getLogger(__name__)

CHECK_EVERY_S = 1.0
"""How long "auto" trusts a primary's count of online replicas before asking it again (``INFO
replication``); a wait that failed or came up short asks again at once."""


class ReplicasBehind(ProjectionStoreError):
    """A primary's replicas did not acknowledge a batch's writes in time (or the wait could not be
    sent there): the batch is not known to survive that primary's failover, so it is not done."""


@dataclass(frozen=True, slots=True)
class Wait:
    """One ``WAIT`` to send: to ``node`` (None: the standalone server), named ``name``, for
    ``replicas`` replicas."""

    name: str
    node: Any = field(repr=False)
    replicas: int


def online_replicas(info: dict[str, Any]) -> int:
    """How many replicas ``INFO replication`` (as redis-py parses it) lists as online: the ones that
    acknowledge offsets, so the ones a ``WAIT`` can count."""
    return sum(1 for k, v in info.items() if k.startswith("slave") and k[5:].isdigit()
               and isinstance(v, dict) and v.get("state") == "online")


class ReplicaWaits:
    """Which primaries a batch must wait on and for how many replicas, the ``WAIT`` commands that
    do it, and the check of their answers (see the module docstring).

    ``probe`` counts a cluster node's online replicas (default: ``INFO replication`` on the node);
    ``clock`` paces those probes. Both are parameters for the tests.
    """

    def __init__(self, client: Any, *, cluster: bool, replicas: int | None = None, timeout_ms: int = 2000,
                 probe: Callable[[Any], int] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if replicas is not None and replicas < 0:
            raise ValueError(f"replicas must be None (auto) or >= 0, got {replicas}")
        if timeout_ms < 1:
            raise ValueError(f"timeout_ms must be >= 1 (WAIT 0 blocks for ever), got {timeout_ms}")
        self.client = client
        self.cluster = cluster
        self.replicas = replicas
        self.timeout_ms = timeout_ms
        self._probe = probe or self._info_probe
        self._clock = clock
        self._known: dict[str, tuple[float, int]] = {}
        """node name -> (when probed, online replicas)."""
        self._warned: set[str] = set()

    @property
    def enabled(self) -> bool:
        """Whether any apply can wait: on a cluster unless 0; standalone only for a number N > 0."""
        if self.replicas is None:
            return self.cluster
        return self.replicas > 0

    def plan(self, keys: Iterable[str]) -> list[Wait]:
        """The waits for writes to ``keys`` (the first key of each script call): one per primary
        owning one of their slots that must be waited on, in the order first met."""
        keys = list(keys)
        if not self.enabled or not keys:
            return []
        if not self.cluster:
            return [Wait("the Redis server", None, self.replicas or 0)]
        nodes: dict[str, Any] = {}
        try:
            for k in keys:
                node = self.client.get_node_from_key(k)
                nodes.setdefault(node.name, node)
        except (redis.RedisError, redis.exceptions.RedisClusterException) as err:
            raise ProjectionStoreError(f"finding the Redis nodes of a batch failed: {err}") from err
        out = []
        for name, node in nodes.items():
            n = self.required(name, node)
            if n:
                out.append(Wait(name, node, n))
        return out

    def required(self, name: str, node: Any) -> int:
        """How many replicas of cluster node ``name`` a write to it waits for (0: none)."""
        if self.replicas is not None:
            return self.replicas
        now = self._clock()
        known = self._known.get(name)
        if known is None or now - known[0] >= CHECK_EVERY_S:
            try:
                known = (now, self._probe(node))
            except (redis.RedisError, redis.exceptions.RedisClusterException) as err:
                raise ProjectionStoreError(f"reading the replication state of Redis node {name} failed: "
                                           f"{err}") from err
            self._known[name] = known
        if known[1] > 0:
            self._warned.discard(name)  # warn again if it loses its replicas again
            return 1
        if name not in self._warned:
            self._warned.add(name)
            log.warning("Redis node %s has no online replica: the projection's writes to it are not "
                        "waited on (RUNLOG_REDIS_WAIT_REPLICAS=auto) and a failover of it now would lose "
                        "the unreplicated ones", name)
        return 0

    def after(self, pipe: Any, keys: Sequence[str]) -> Callable[[list[Any]], list[Any]]:
        """Queue on ``pipe``, after the writes to ``keys`` queued already, the waits they need.
        Returns the function that takes the pipeline's answers (``raise_on_error=False``), raises
        :class:`ReplicasBehind` unless every wait was answered by enough replicas on the connection
        that made the writes, and returns the answers of the writes."""
        waits = self.plan(keys)
        if not waits:
            return lambda results: results
        for w in waits:
            if w.node is None:
                pipe.execute_command("WAIT", w.replicas, self.timeout_ms)
            else:
                pipe.execute_command("WAIT", w.replicas, self.timeout_ms, target_nodes=w.node)
        slots = self._slot_map()

        def check(results: list[Any]) -> list[Any]:
            head, tail = results[:-len(waits)], results[-len(waits):]
            self.check(waits, tail, rerouted=self._rerouted(pipe, slots))
            return head

        return check

    def check(self, waits: Sequence[Wait], answers: Sequence[Any], *, rerouted: bool = False) -> None:
        """Raise :class:`ReplicasBehind` for the first wait that failed or was answered by fewer
        replicas than it asked for (its node is probed again on the next apply), or when the
        pipeline was ``rerouted`` (then no answer is known to count the writes)."""
        if rerouted:
            self._known.clear()
            raise ReplicasBehind("the Redis Cluster's slot map changed while a batch was written (a command "
                                 "was redirected or resent): its writes are not known to be on replicas")
        for w, got in zip(waits, answers, strict=True):
            if isinstance(got, Exception) or not isinstance(got, int) or got < w.replicas:
                self._known.pop(w.name, None)
                said = (f"failed: {got}" if isinstance(got, Exception)
                        else f"was answered by {got} of {w.replicas} replicas within {self.timeout_ms} ms")
                raise ReplicasBehind(f"WAIT for the batch's writes on Redis node {w.name} {said}")

    # -- redis-py's cluster internals, read in one place ------------------------------------------

    def _info_probe(self, node: Any) -> int:
        return online_replicas(self.client.get_redis_connection(node).info("replication"))

    def _slot_map(self) -> Any:
        """The cluster client's slot table object: redis-py replaces it whenever it reloads the
        cluster's layout (after a lost connection, or every few ``MOVED``)."""
        return getattr(getattr(self.client, "nodes_manager", None), "slots_cache", None)

    def _rerouted(self, pipe: Any, slots: Any) -> bool:
        """Whether a cluster pipeline left its first routing: redis-py counts on the pipeline each
        time it resent commands one by one (``reinitialize_counter``), and reloads the slot table
        before resending a whole pipeline."""
        if not self.cluster:
            return False
        return bool(getattr(pipe, "reinitialize_counter", 0)) or self._slot_map() is not slots
