"""The chaos workload: keeps a few runs in flight, each a worker process (``processors.chaos.worker``)
of a workflow drawn at random (the demo's ``content`` and ``checkout``, and ``ledger``), through the sync
or the async SDK, and delivers the ``approval`` signal to every ``ledger`` run that waits for it.

A run blocked with its card charge in doubt (a ``NEVER`` tool cut between its intent and its result)
is resolved as a person would: the payment system's own records (the demo world's ``payments``
database) say whether the charge with the run's reference exists, and ``resolve_effect`` records
that (done, with the charge's id, or not done); the resumers then continue the run.
"""

from __future__ import annotations

import itertools
import json
import random
import sqlite3
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runlog.processors.chaos.app import APPROVAL, WORKFLOWS
from runlog.processors.operate import OperatorRefused, load_run, resolve_effect
from runlog.processors.signal import signal_run
from runlog.projections import RunStatus
from runlog.schemas import Settings

__all__ = ["WorkerProc", "Workload"]

_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class WorkerProc:
    n: int
    workflow: str
    sdk: str
    proc: subprocess.Popen[bytes]
    out: Path
    reference: str | None = None
    """The charge reference of its run (checkout and ledger)."""
    run_id: str | None = None
    killed: bool = False

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_run_id(self) -> str | None:
        """Its run's id: the ``run_id=`` line it printed, else the run of its first acknowledged append
        (a worker killed between ``RUN_STARTED`` and its print left a run all the same)."""
        if self.run_id is None:
            for line in self.out.read_text(errors="replace").splitlines():
                if line.startswith("run_id="):
                    self.run_id = line.split("=", 1)[1].strip()
        if self.run_id is None and not self.alive:
            acks = self.out.with_suffix(".acks")
            first = acks.read_text(errors="replace").split(maxsplit=1) if acks.exists() else []
            self.run_id = first[0] if first else None
        return self.run_id


@dataclass
class Workload:
    """Starts workers, tracks their runs, signals waiting ``ledger`` runs."""

    env: Mapping[str, str]
    """The workers' environment (their proxied addresses, the demo world's URL)."""
    harness: Settings
    """Straight to the broker and Redis: reading run states and delivering signals."""
    dir: Path
    rng: random.Random
    in_flight: int = 3
    world_dir: Path | None = None
    """The demo world's files: where a person looks before resolving a charge in doubt."""
    workers: list[WorkerProc] = field(default_factory=list)
    runs: dict[str, str] = field(default_factory=dict)
    """Run id -> workflow, for every run a worker printed."""
    signalled: set[str] = field(default_factory=set)
    signal_errors: int = 0
    references: dict[str, str] = field(default_factory=dict)
    """Run id -> its charge reference."""
    resolved: dict[str, str] = field(default_factory=dict)
    """Run id -> how its charge in doubt was resolved."""
    _n: itertools.count[int] = field(default_factory=lambda: itertools.count(1))

    def acks_files(self) -> list[Path]:
        return sorted(self.dir.glob("*.acks"))

    def alive(self) -> list[WorkerProc]:
        return [w for w in self.workers if w.alive]

    def start_one(self) -> WorkerProc:
        n = next(self._n)
        workflow = WORKFLOWS[n % len(WORKFLOWS)] if self.rng.random() < 0.5 else self.rng.choice(WORKFLOWS)
        sdk = self.rng.choice(("sync", "async"))
        params: dict[str, object] = {"seed": n}
        reference = None
        if workflow == "checkout":
            reference = f"order-{n}"
            params.update(order=reference, cents=100 + n)
        elif workflow == "ledger":
            reference = f"ledger-n{n}"
            params.update(name=f"n{n}", cents=200 + n)
        out = self.dir / f"worker-{n}.out"
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runlog.processors.chaos.worker", "--workflow", workflow, "--params",
                 json.dumps(params), "--sdk", sdk, "--acks", str(self.dir / f"worker-{n}.acks")],
                cwd=_ROOT, env=dict(self.env), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True)
        w = WorkerProc(n, workflow, sdk, proc, out, reference)
        self.workers.append(w)
        return w

    def tick(self, *, start: bool = True) -> None:
        """Note new run ids, top up the workers in flight (when ``start``), signal waiting runs."""
        for w in self.workers:
            if w.read_run_id() is not None and w.run_id not in self.runs:
                self.runs[w.run_id] = w.workflow  # type: ignore[index]
                if w.reference is not None:
                    self.references[w.run_id] = w.reference  # type: ignore[index]
        while start and len(self.alive()) < self.in_flight:
            self.start_one()
        self.signal_waiting()
        self.resolve_blocked()

    def signal_waiting(self) -> None:
        for run_id, wf in list(self.runs.items()):
            if wf != "ledger" or run_id in self.signalled:
                continue
            try:
                state = load_run(self.harness, run_id)
                if state is None or state.status is not RunStatus.WAITING:
                    continue
                signal_run(self.harness, run_id, APPROVAL, {"approved": True}, by="chaos",
                           reason="the chaos workload approves every ledger run")
                self.signalled.add(run_id)
            except OperatorRefused:
                continue  # moved meanwhile, or a resume holds it: next tick
            except Exception:  # noqa: BLE001 - a service down (Redis or Kafka): next tick
                self.signal_errors += 1

    def resolve_blocked(self) -> None:
        """Resolve each blocked run's charge in doubt from the payment system's records."""
        if self.world_dir is None:
            return
        for run_id, reference in list(self.references.items()):
            if run_id in self.resolved:
                continue
            try:
                state = load_run(self.harness, run_id)
                if state is None or state.status is not RunStatus.BLOCKED:
                    continue
                doubt = [e for e in state.open_effects.values() if e.tool == "charge"]
                if not doubt:
                    continue
                with sqlite3.connect(self.world_dir / "payments.db") as db:
                    row = db.execute("SELECT id FROM charges WHERE reference = ? ORDER BY id LIMIT 1",
                                     (reference,)).fetchone()
                ext = f"ch-{row[0]}" if row is not None else None
                resolve_effect(self.harness, run_id, doubt[0].delivery_key, done=ext is not None,
                               external_id=ext, by="chaos",
                               reason=f"the payment system {'holds' if ext else 'has no'} charge {reference}")
                self.resolved[run_id] = f"done ({ext})" if ext else "not done"
            except OperatorRefused:
                continue
            except Exception:  # noqa: BLE001 - a service down: next tick
                self.signal_errors += 1

    def worker_ends(self) -> dict[str, int]:
        """How the workers ended: ``completed`` (their run did), ``let go`` (the runner returned with the
        run not completed: waiting, or its lease lost to a takeover), ``killed`` (by a fault), ``error``
        (exited with an error: the resumers continue its run)."""
        out = {"completed": 0, "let go": 0, "killed": 0, "error": 0}
        for w in self.workers:
            if w.alive:
                continue
            text = w.out.read_text(errors="replace")
            key = ("killed" if w.killed else "completed" if "completed=True" in text else
                   "let go" if "completed=False" in text else "error")
            out[key] += 1
        return out

    def started(self) -> int:
        return len(self.workers)
