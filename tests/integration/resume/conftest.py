"""Fixtures of the resume tests: a demo world per test, crashed demo workers, reading a run's log."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest

from runlog.processors.demo import WorldClient, serve
from runlog.processors.demo.pipeline import app_for
from runlog.processors.demo.run import spawn_worker, wait_lease_gone, wait_worker
from runlog.processors.inspect import LoggedEvent, run_history
from runlog.processors.resume import App
from runlog.schemas import EventType, Settings


@dataclass(frozen=True)
class DemoWorld:
    """One demo world (search, renderer, assets, platform, payments) served on 127.0.0.1."""

    url: str
    client: WorldClient

    def app(self, *, version: str = "1") -> App:
        return app_for(self.client, version=version)

    def stats(self) -> dict[str, int]:
        return self.client.stats()


@contextmanager
def served_world(root: Path) -> Iterator[DemoWorld]:
    """One demo world (payments, ...) with its storage under ``root``, served on 127.0.0.1."""
    server = serve(root)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield DemoWorld(url, WorldClient(url))
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def world(tmp_path: Path) -> Iterator[DemoWorld]:
    with served_world(tmp_path / "world") as w:
        yield w


def crash_runs(settings: Settings, world: DemoWorld, points: Sequence[str | tuple[str, str]],
               logs: Path) -> list[str]:
    """Start one worker per crash point at once (``(point, workflow)`` or a point of the content
    workflow), check each was SIGKILLed there, wait for their leases to expire; the run ids."""
    procs = []
    for i, p in enumerate(points):
        point, workflow = (p, "content") if isinstance(p, str) else p
        procs.append((i, point, spawn_worker(settings, world.url, point, workflow=workflow)))
    ids = []
    for i, point, proc in procs:
        log = logs / f"worker-{i}.log"
        run_id, rc = wait_worker(proc, log, timeout_s=120)
        assert rc == -9, f"worker for {point} exited {rc}, not killed: {log.read_text()}"
        ids.append(run_id)
    for run_id in ids:
        wait_lease_gone(settings, run_id, settings.lease_ttl_ms / 1000 * 4)
    return ids


def crash_run(settings: Settings, world: DemoWorld, point: str, logs: Path, workflow: str = "content") -> str:
    return crash_runs(settings, world, [(point, workflow)], logs)[0]


def accepted(history: list[LoggedEvent]) -> list[LoggedEvent]:
    return [le for le in history if le.outcome.accepted]


def types_of(history: list[LoggedEvent]) -> list[EventType]:
    return [le.event.type for le in accepted(history)]


def log_of(settings: Settings, run_id: str) -> list[LoggedEvent]:
    history = run_history(settings, run_id)
    assert history, f"no events of {run_id} on the log"
    return history


def project(settings: Settings) -> int:
    """Fold the whole events topic into the live Redis prefix, as the projector does (its
    BatchProjector, at-least-once safe); returns the records read."""
    from runlog.projections import BatchProjector, RawRecord, RedisStore
    from runlog.projections.log_reader import read_topic
    from runlog.schemas import Codec

    proj = BatchProjector(RedisStore.from_settings(settings), Codec())
    n = 0
    for batch in read_topic(settings):
        proj.process([RawRecord(m.topic(), m.partition(), m.offset(), m.key(), m.value()) for m in batch])
        n += len(batch)
    return n
