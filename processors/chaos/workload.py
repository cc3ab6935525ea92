"""The chaos workload: keeps a few runs in flight, each a worker process (``processors.chaos.worker``)
of a workflow drawn at random (the demo's ``content`` and ``checkout``, and ``ledger``), through the sync
or the async SDK, and delivers the ``approval`` signal to every ``ledger`` run that waits for it.
"""

from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runlog.processors.chaos.app import APPROVAL, WORKFLOWS
from runlog.processors.operate import OperatorRefused, load_run
from runlog.processors.signal import signal_run
from runlog.projections import RunStatus
from runlog.schemas import RunlogError, Settings

__all__ = ["Workload", "WorkerProc"]

_ROOT = str(Path(__file__).resolve().parents[2])


@dataclass
class WorkerProc:
    n: int
    workflow: str
    sdk: str
    proc: subprocess.Popen[bytes]
    out: Path
    run_id: str | None = None

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def read_run_id(self) -> str | None:
        if self.run_id is None:
            for line in self.out.read_text(errors="replace").splitlines():
                if line.startswith("run_id="):
                    self.run_id = line.split("=", 1)[1].strip()
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
    workers: list[WorkerProc] = field(default_factory=list)
    runs: dict[str, str] = field(default_factory=dict)
    """Run id -> workflow, for every run a worker printed."""
    signalled: set[str] = field(default_factory=set)
    signal_errors: int = 0
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
        if workflow == "checkout":
            params.update(order=f"order-{n}", cents=100 + n)
        elif workflow == "ledger":
            params.update(name=f"n{n}", cents=200 + n)
        out = self.dir / f"worker-{n}.out"
        self.dir.mkdir(parents=True, exist_ok=True)
        with open(out, "wb") as fh:
            proc = subprocess.Popen(
                [sys.executable, "-m", "runlog.processors.chaos.worker", "--workflow", workflow, "--params",
                 json.dumps(params), "--sdk", sdk, "--acks", str(self.dir / f"worker-{n}.acks")],
                cwd=_ROOT, env=dict(self.env), stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                start_new_session=True)
        w = WorkerProc(n, workflow, sdk, proc, out)
        self.workers.append(w)
        return w

    def tick(self, *, start: bool = True) -> None:
        """Note new run ids, top up the workers in flight (when ``start``), signal waiting runs."""
        for w in self.workers:
            if w.read_run_id() is not None and w.run_id not in self.runs:
                self.runs[w.run_id] = w.workflow  # type: ignore[index]
        while start and len(self.alive()) < self.in_flight:
            self.start_one()
        self.signal_waiting()

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
            except RunlogError:
                self.signal_errors += 1  # a service down: next tick

    def started(self) -> int:
        return len(self.workers)
