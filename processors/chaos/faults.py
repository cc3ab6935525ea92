"""The fault scheduler: picks a fault kind at random, at random gaps, and runs it through the action the
chaos run gives for that kind; every fault injected is recorded (kind, when, what it hit, how long).

The kinds are those the fault suite knows: processes (SIGKILL and SIGSTOP of workers, resumers and
projectors), the broker restarted, Redis restarted, group membership changes, and the network through
Toxiproxy (latency, connection resets, partitions). :func:`plan` is pure (a seeded random generator in,
a schedule out) so it is tested without services; :class:`Scheduler` carries a plan out.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

__all__ = ["KINDS", "Fault", "Planned", "Scheduler", "plan"]

KINDS = ("kill-worker", "stop-worker", "kill-resumer", "stop-resumer", "kill-projector", "stop-projector",
         "broker-restart", "redis-restart", "membership", "net-latency", "net-reset", "net-partition")
"""Every fault kind a chaos run injects."""


@dataclass(frozen=True)
class Planned:
    """A fault to inject ``at`` seconds after the start."""

    at: float
    kind: str


@dataclass
class Fault:
    """A fault injected: its kind, when (seconds after the start), what it hit, and whether it landed."""

    kind: str
    at: float
    target: str = ""
    seconds: float = 0.0
    error: str = ""

    @property
    def injected(self) -> bool:
        return not self.error


def plan(rng: random.Random, duration: float, *, gap: tuple[float, float] = (15.0, 45.0),
         kinds: Sequence[str] = KINDS, start: float = 10.0, quiet_tail: float = 0.0) -> list[Planned]:
    """Faults at random gaps in ``gap`` from ``start`` until ``duration - quiet_tail``; the kind of each is
    drawn so that every kind comes once before any comes twice (a shuffled round, then the next)."""
    out: list[Planned] = []
    at = start
    pool: list[str] = []
    while at < duration - quiet_tail:
        if not pool:
            pool = list(kinds)
            rng.shuffle(pool)
        out.append(Planned(round(at, 1), pool.pop()))
        at += rng.uniform(*gap)
    return out


Action = Callable[[random.Random], tuple[str, float]]
"""Injects one fault, heals it, returns (what it hit, seconds it lasted); raises when it could not."""


class Scheduler:
    """Runs a plan in a thread of its own: each fault at its time (one at a time: a fault that lasts
    past the next one's time delays it), through ``actions[kind]``."""

    def __init__(self, schedule: Sequence[Planned], actions: Mapping[str, Action], rng: random.Random,
                 say: Callable[[str], None] = lambda _: None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        missing = sorted({p.kind for p in schedule} - set(actions))
        if missing:
            raise ValueError(f"no action for fault kinds {', '.join(missing)}")
        self.schedule, self.actions, self.rng, self.say, self.clock = list(schedule), actions, rng, say, clock
        self.faults: list[Fault] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._t0 = 0.0

    def start(self) -> None:
        self._t0 = self.clock()
        self._thread = threading.Thread(target=self.run, name="chaos-faults", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 300.0) -> None:
        """No new fault; wait for the one in hand to heal."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        for p in self.schedule:
            wait = p.at - (self.clock() - self._t0)
            if wait > 0 and self._stop.wait(wait):
                return
            if self._stop.is_set():
                return
            self.inject(p)

    def inject(self, p: Planned) -> Fault:
        f = Fault(p.kind, round(self.clock() - self._t0, 1))
        try:
            f.target, f.seconds = self.actions[p.kind](self.rng)
        except Exception as err:  # noqa: BLE001 - a fault that could not land is recorded, not fatal
            f.error = f"{type(err).__name__}: {err}"[:200]
        self.faults.append(f)
        self.say(f"fault {f.kind:<15} {f.target or '-'} {f.seconds:.1f}s" + (f" NOT INJECTED: {f.error}"
                                                                               if f.error else ""))
        return f

    def injected_by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for f in self.faults if f.injected).items()))

    def failed_by_kind(self) -> dict[str, int]:
        return dict(sorted(Counter(f.kind for f in self.faults if not f.injected).items()))
