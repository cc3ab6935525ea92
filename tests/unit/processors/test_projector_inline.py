"""Small batches applied on the event loop (``ProjectorOptions.inline_records``): the same store as
the worker's path, and what the loop cannot do alone (publish, recover) handed to the worker."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

from runlog.projections import BatchProjector, MemoryStore
from runlog.projections.redis_store import ProjectionLost
from runlog.schemas import Checkpoint
from tests.unit._schema_log import RecordingSchemaLog
from tests.unit.processors.test_projector_rebalance import (
    TOPIC,
    TP,
    Group,
    Member,
    Store,
    member,
    shutdown,
    the_log,
)
from tests.unit.projections.store_contract import CODEC

__all__ = ["shutdown"]  # the fixture, imported for pytest


def inline_member(group: Group, store: Store, n: int = 64) -> Member:
    m = member(group, store)
    m.projector.inline_records = n
    return m


def threads_of(store: Store) -> list[str]:
    seen: list[str] = []
    apply = store.apply

    def spy(updates: Any) -> Any:
        seen.append(threading.current_thread().name)
        return apply(updates)

    store.apply = spy  # type: ignore[method-assign]
    return seen


def run(m: Member, batches: list[list[Any]]) -> None:
    async def main() -> None:
        await m.projector.start()
        await m.projector.on_assigned(None, {TP(TOPIC, 0)})
        for b in batches:
            await m.feed(b)
            await m.next_batch()

    asyncio.run(main())


def expected(log: list[Any]) -> MemoryStore:
    want = MemoryStore()
    BatchProjector(want, CODEC).process(log)
    return want


def test_small_batches_without_outputs_are_applied_on_the_loop(shutdown: Callable[[Member], None]) -> None:
    log = the_log(stages=1)
    group, store = Group(log), Store()
    m = inline_member(group, store)
    shutdown(m)
    applied_on = threads_of(store)
    # RUN_STARTED, the first STAGE_STARTED, a TOOL_CALLED: nothing to publish. The first batch after the
    # assignment goes to the worker (the guard asks the group's commits: a broker round trip)
    run(m, [log[:1], log[1:2], log[2:3]])
    assert applied_on[0].startswith("project") and applied_on[1:] == ["MainThread", "MainThread"]
    assert (m.projector.inline_batches, m.projector.inline_refused) == (2, 0)
    assert m.consumer.acked == [(0, 0), (0, 1), (0, 2)]
    assert store.inner.load_state("r0") == expected(log[:3]).load_state("r0")


def test_a_batch_that_publishes_goes_to_the_worker_and_publishes_once(
        shutdown: Callable[[Member], None]) -> None:
    log = the_log(stages=2)
    group, store = Group(log), Store()
    m = inline_member(group, store)
    shutdown(m)
    applied_on = threads_of(store)
    run(m, [log[:1], log[1:]])  # the second holds VERIFIED events: checkpoints to publish before the apply
    assert m.projector.inline_refused == 1 and m.projector.inline_batches == 0
    assert applied_on and all(t.startswith("project") for t in applied_on)
    cps = [CODEC.decode(v, Checkpoint) for _k, v in m.checkpoints.sent if v is not None]
    assert [c.stage for c in cps] == ["research", "verify"]  # each once: the loop's refusal sent nothing
    assert store.inner.load_state("r0") == expected(log).load_state("r0")


def test_a_batch_above_the_limit_goes_to_the_worker(shutdown: Callable[[Member], None]) -> None:
    log = the_log(stages=1)
    group, store = Group(log), Store()
    m = inline_member(group, store, n=1)
    shutdown(m)
    applied_on = threads_of(store)
    run(m, [log[:1], log[1:3]])
    assert m.projector.inline_batches == 0 and len(applied_on) == 2
    assert all(t.startswith("project") for t in applied_on)


def test_a_lost_namespace_met_on_the_loop_is_recovered_by_the_worker(
        shutdown: Callable[[Member], None]) -> None:
    log = the_log(stages=1)
    group, store = Group(log), Store()
    m = inline_member(group, store)
    shutdown(m)
    # after the first batch (on the worker: the first after the assignment), the namespace is lost:
    # the loop meets the first refusal and hands the batch on; the worker meets the second and recovers
    store.after_apply = lambda: store.failures.extend([ProjectionLost("the namespace is gone"),
                                                       ProjectionLost("still gone")])
    run(m, [log[:1], log[1:2]])
    assert m.projector.inline_refused == 1
    assert "recover" in m.projector.namespace.calls  # type: ignore[attr-defined]
    assert store.inner.load_state("r0") == expected(log).load_state("r0")  # the recovery replays the log


def test_writer_schemas_of_checkpoints_and_effects_are_published_on_the_worker_before_the_first_batch(
        shutdown: Callable[[Member], None]) -> None:
    """The first encode of a checkpoint would publish its writer schema and wait for the broker, on
    the event loop (a stall of every record behind it): a member publishes them at start, on its
    worker thread, and the loop's encodes publish nothing."""
    from runlog.schemas import Codec

    schema_log = RecordingSchemaLog()
    published = schema_log.published
    log = the_log(stages=2)
    m = inline_member(Group(log), Store())
    shutdown(m)
    m.projector.core.codec = Codec().with_schema_log(schema_log)
    run(m, [log])
    assert sorted(name for name, _ in published) == ["runlog.Checkpoint", "runlog.Effect"]
    assert all(thread.startswith("project") for _, thread in published), published
    assert m.checkpoints.sent, "the batch published checkpoints (encoded with the schemas published)"
