"""The in-memory world the agent integrations' unit tests run in: a
:class:`~tests.unit.producers._replay.MemoryWorld` that also says which tools a run called."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from runlog.producers import load_args
from runlog.schemas import EventType
from tests.unit.producers._replay import MemoryWorld


class World(MemoryWorld):
    def called(self, run_id: str) -> list[str]:
        """The tools of the run's calls, in the order they were called."""
        return [e.tool or "" for e in self.events(run_id) if e.type is EventType.TOOL_CALLED]

    def effect_failed_undone(self, call_id: str) -> bool:
        """Whether the world's one run failed at its call ``call_id`` with the effect undone: its
        delivery key is in the ledger and free again."""
        [run_id] = self.log.run_ids()
        failed = [e for e in self.events(run_id) if e.type is EventType.FAILED]
        if not failed or failed[0].call_id != call_id or not failed[0].delivery_key:
            return False
        entry = self.ledger.lookup(failed[0].delivery_key)
        return entry is not None and not entry.done

    def call_args(self, run_id: str, tool: str, n: int) -> dict[str, Any]:
        """The recorded arguments of the run's ``n``-th call of ``tool``, read back whole."""
        called = [e for e in self.events(run_id) if e.type is EventType.TOOL_CALLED and e.tool == tool]
        assert called[n].payload_ref is not None
        return load_args(self.store, called[n].payload_ref)


@contextmanager
def open_world(**kw: Any) -> Iterator[World]:
    """A world (``kw``: the runner's options, ``prices=...``), its runner closed at the end."""
    w = World(**kw)
    try:
        yield w
    finally:
        w.runner.close()
