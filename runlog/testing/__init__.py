"""Test your workflows without Kafka or Redis: Runlog's in-memory parts, and crashes in-process.

The in-memory adapters are the ones Runlog's own unit tests run on, and each passes the same
contract tests as its real twin:

* :class:`InMemoryEventLog`: the events topic (Kafka);
* :class:`InMemoryLeaseManager` on an :class:`InMemoryLeaseTable`: the run leases (Redis);
* :class:`InMemoryEffectLedger`: the effects ledger (Redis);
* :class:`MemoryStore`: the projection store, the runs' read model (Redis);
* :class:`InMemoryArtifactStore`: the artifact store (a directory).

:class:`InMemoryWorld` puts them together with a runner, a resumer and a projector, and crashes a
run at any point of :mod:`runlog.producers.crash` in-process, then resumes it::

    world = InMemoryWorld(app)
    result = world.crash_and_resume(wf, {"to": "grace"}, at="before:EFFECT_RESULT")
    assert result.completed and result.executions["send"] == 1

A simulated crash raises :class:`SimulatedCrash` where the real one would SIGKILL the worker; the
worker's later appends are dropped, its lease expires, and the run is resumed by the resumer that
``runlog resumer`` runs. What differs from a real crash: the dead worker's ``finally`` blocks run
(their appends are dropped), and the crash point is one per process (crashes do not overlap).
"""

from runlog.producers.internal import (
    InMemoryArtifactStore,
    InMemoryEffectLedger,
    InMemoryEventLog,
    InMemoryLease,
    InMemoryLeaseManager,
    InMemoryLeaseTable,
    LoggedEvent,
)
from runlog.projections import MemoryStore
from runlog.testing._world import CrashPointNotReached, CrashResult, InMemoryWorld, SimulatedCrash

__all__ = [
    "CrashPointNotReached",
    "CrashResult",
    "InMemoryArtifactStore",
    "InMemoryEffectLedger",
    "InMemoryEventLog",
    "InMemoryLease",
    "InMemoryLeaseManager",
    "InMemoryLeaseTable",
    "InMemoryWorld",
    "LoggedEvent",
    "MemoryStore",
    "SimulatedCrash",
]
