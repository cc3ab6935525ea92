"""A rolling upgrade of Runlog loses nothing (issue #38, item 1): the previous release's projector
and resumer beside this release's writers, and the reverse, on the real broker and Redis.

"The previous release" is the code of :data:`PREVIOUS` from this repository's history: the last
commit whose ``run_event.avsc`` is schema version 4 (the next one added ``usage``, version 5). It is
extracted with ``git archive`` into a temporary directory and run as processes of its own
(``python -m processors.cli ...``: it predates the single ``runlog`` import root, so it imports as
``schemas``, ``producers``, ``processors``, ``projections``) with this virtualenv's packages.

Each scenario: writer processes of one release start runs and crash them in their last stage; the
other release's projector and resumer (with a short lease and sweep) pick the crashed runs up and
complete them, so every run's log mixes both releases' events. This release's processes are pinned
to version 4 (``RUNLOG_SCHEMA_VERSION=4``, the oldest version the fleet reads). Then: every run
completed, nothing on the dead-letter topic, the reading release's live projection says COMPLETED
for every run, and its rebuild from the log equals its live projection (``projections rebuild
--diff``). A control run without the pin shows the test can fail: the previous release
dead-letters this release's unpinned events.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from runlog.schemas import Codec, EventType, RunEvent, Settings, Topics

pytestmark = [pytest.mark.integration, pytest.mark.slow]

PREVIOUS = "1186443"
"""The previous release: the last commit with RunEvent schema version 4 as its current schema."""

REPO = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
RUNS_PER_WRITER = 4


@dataclass(frozen=True)
class Release:
    """A release as processes: how to start its CLI and its import root."""

    name: str
    pythonpath: str
    cli: tuple[str, ...]
    import_root: str
    pinned: bool


@pytest.fixture(scope="module")
def previous(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's tree, from git history (a failure, never a skip, when it cannot be built)."""
    out = tmp_path_factory.mktemp("previous-release")
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    assert (out / "schemas" / "avro" / "run_event.avsc").is_file(), "the previous release has no schemas"
    return out


def _releases(previous: Path, appdir: Path) -> dict[str, Release]:
    return {
        "previous": Release("previous", f"{previous}{os.pathsep}{appdir}", ("-m", "processors.cli"), "",
                            False),
        "current": Release("current", f"{REPO}{os.pathsep}{appdir}", ("-m", "runlog"), "runlog.", True),
    }


def _env(s: Settings, release: Release, *, pin: bool = True) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNLOG_", "KAFKA_", "REDIS_"))}
    env.update(s.to_env())
    env.update({
        "PYTHONPATH": release.pythonpath,
        "UPGRADE_IMPORT_ROOT": release.import_root,
        "RUNLOG_METRICS_PORT": "0",
        "RUNLOG_LEASE_TTL_MS": "1500",
        "RUNLOG_SWEEP_INTERVAL_MS": "500",
    })
    env.pop("RUNLOG_SCHEMA_VERSION", None)
    if release.pinned and pin:
        env["RUNLOG_SCHEMA_VERSION"] = "4"
    return env


class Fleet:
    """The processes of one scenario; every one is stopped (SIGTERM, then SIGKILL) at the end."""

    def __init__(self, s: Settings, workdir: Path) -> None:
        self.s = s
        self.workdir = workdir
        self.procs: list[tuple[str, subprocess.Popen[str]]] = []

    def start(self, what: str, release: Release, args: list[str], *,
              pin: bool = True) -> subprocess.Popen[str]:
        with open(self.workdir / f"{release.name}-{what}.log", "w") as log:  # the child keeps its own fd
            p = subprocess.Popen([sys.executable, *release.cli, *args], cwd=self.workdir,
                                 env=_env(self.s, release, pin=pin), stdout=log, stderr=subprocess.STDOUT,
                                 text=True)
        self.procs.append((f"{release.name}-{what}", p))
        return p

    def write(self, release: Release, tag: str, *, pin: bool = True) -> list[str]:
        """Run a writer process of ``release`` to its end: its crashed runs' ids."""
        script = str(self.workdir / "app" / "mixed_writer.py")
        out = subprocess.run([sys.executable, script, tag, str(RUNS_PER_WRITER)],
                             cwd=self.workdir, env=_env(self.s, release, pin=pin), capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, f"{release.name} writer failed: {out.stderr[-3000:]}"
        ids = out.stdout.split()
        assert len(ids) == RUNS_PER_WRITER, out.stdout
        return ids

    def cli(self, release: Release, args: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, *release.cli, *args], cwd=self.workdir,
                              env=_env(self.s, release), capture_output=True, text=True, timeout=120)

    def alive(self) -> None:
        for name, p in self.procs:
            assert p.poll() is None, f"{name} exited {p.returncode}: {self.tail(name)}"

    def tail(self, name: str) -> str:
        path = self.workdir / f"{name}.log"
        return path.read_text()[-3000:] if path.exists() else ""

    def stop(self) -> None:
        for _, p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for _, p in self.procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(10)


@pytest.fixture
def fleet(topics: Settings, tmp_path: Path) -> Iterator[Fleet]:
    app = tmp_path / "app"
    app.mkdir()
    for f in ("mixed_app.py", "mixed_writer.py"):
        shutil.copy(HERE / f, app / f)
    f = Fleet(topics, tmp_path)
    try:
        yield f
    finally:
        f.stop()


def _events(s: Settings) -> list[tuple[bytes, RunEvent]]:
    """Every record of the events topic: its bytes, decoded by this release."""
    from confluent_kafka import Consumer, TopicPartition

    from runlog.schemas.internal import watermarks

    codec = Codec.from_settings(s)
    topic = Topics.of(s).events
    c = Consumer(s.consumer_config(f"upg-read-{uuid.uuid4().hex[:8]}"))
    try:
        marks = {p: hw for p, (lw, hw) in watermarks(c, topic).items() if hw > lw}
        if not marks:
            return []
        c.assign([TopicPartition(topic, p, 0) for p in marks])
        out: list[tuple[bytes, RunEvent]] = []
        while marks:
            for m in c.consume(500, timeout=1.0):
                if m.error() is None:
                    out.append((m.value(), codec.decode(m.value(), RunEvent)))
                    if m.offset() + 1 >= marks.get(m.partition(), 0):
                        marks.pop(m.partition(), None)
        return out
    finally:
        c.close()


def _completed(s: Settings) -> set[str]:
    return {e.run_id for _, e in _events(s) if e.type is EventType.RUN_COMPLETED}


def _dead_letters(s: Settings) -> int:
    from confluent_kafka import Consumer

    from runlog.schemas.internal import watermarks

    c = Consumer(s.consumer_config(f"upg-dlq-{uuid.uuid4().hex[:8]}"))
    try:
        return sum(hw - lw for lw, hw in watermarks(c, Topics.of(s).dlq).values())
    finally:
        c.close()


def _until(check: object, what: str, fleet: Fleet, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        fleet.alive()
        if check():  # type: ignore[operator]
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}: " + " | ".join(
        f"{n}: {fleet.tail(n)[-800:]}" for n, _ in fleet.procs))


def _live_statuses(fleet: Fleet, release: Release) -> dict[str, str]:
    out = fleet.cli(release, ["runs", "--json"])
    assert out.returncode == 0, out.stderr[-2000:]
    return {r["run_id"]: r["status"] for r in json.loads(out.stdout)}


def _roll(fleet: Fleet, releases: dict[str, Release], writers: str, readers: str) -> list[str]:
    """``writers``' writer processes beside ``readers``' projector and resumer; returns the run ids,
    each completed, checked as the module docstring says."""
    w, r = releases[writers], releases[readers]
    fleet.start("projector", r, ["project", "--app-id", f"upg-proj-{r.name}"])
    fleet.start("resumer", r, ["resumer", "--app", "mixed_app:app"])
    runs = fleet.write(w, "a") + fleet.write(w, "b")
    _until(lambda: set(runs) <= _completed(fleet.s), "every run completed", fleet, 120)
    _until(lambda: all(_live_statuses(fleet, r).get(x) == "COMPLETED" for x in runs),
           f"the {r.name} projection to show every run COMPLETED", fleet, 60)
    assert _dead_letters(fleet.s) == 0, "records were dead-lettered: " + fleet.tail(f"{r.name}-projector")
    rebuilt = fleet.cli(r, ["projections", "rebuild", "--diff", "--json", "--quiet"])
    assert rebuilt.returncode == 0, rebuilt.stdout[-2000:] + rebuilt.stderr[-2000:]
    assert json.loads(rebuilt.stdout)["differing_keys"] == []
    # every event of these runs was written with version 4: the pinned release's and the other's
    written = {body[2:10] for body, e in _events(fleet.s) if e.run_id in runs}
    assert written == {_v4_fingerprint()}, [fp.hex() for fp in written]
    return runs


def _v4_fingerprint() -> bytes:
    return Codec(schema_version=4).writer_schema("runlog.RunEvent")[1]


def test_previous_release_projector_and_resumer_beside_current_writers(
        fleet: Fleet, previous: Path) -> None:
    releases = _releases(previous, fleet.workdir / "app")
    runs = _roll(fleet, releases, writers="current", readers="previous")
    events = _events(fleet.s)
    # the usage the current writers reported travels with the events (attributes), read back as usage
    assert any(e.usage is not None and e.usage.model == "test:model" for _, e in events if e.run_id in runs)


def test_current_projector_and_resumer_beside_previous_writers(fleet: Fleet, previous: Path) -> None:
    releases = _releases(previous, fleet.workdir / "app")
    runs = _roll(fleet, releases, writers="previous", readers="current")
    assert len(runs) == 2 * RUNS_PER_WRITER


def test_without_the_pin_the_previous_release_dead_letters_current_events(
        fleet: Fleet, previous: Path) -> None:
    """The control: this release's writers unpinned beside the previous release's projector."""
    releases = _releases(previous, fleet.workdir / "app")
    fleet.start("projector", releases["previous"], ["project", "--app-id", "upg-proj-control"])
    fleet.write(releases["current"], "c", pin=False)
    _until(lambda: _dead_letters(fleet.s) > 0, "a dead letter", fleet, 60)
