"""Schedules: what starts a run of a workflow on every tick of a clock, and the clock itself.

A :class:`Schedule` names a workflow, its parameters and a clock: a 5-field cron expression
(:class:`Cron`, UTC) or a fixed period (``every``, seconds, ticks at whole multiples of the period
since the epoch; for tests and short intervals). Each tick starts one run whose idempotency key is
``schedule:<name>:<tick time ms>`` (:meth:`Schedule.run_key`), so however many members tick, a tick
is one run. ``catch_up`` says what happens to ticks missed while no member was ticking (older than
:data:`ON_TIME_MS` when first seen): ``one`` starts the latest missed tick only, ``all`` every one
(at most :data:`CATCH_UP_MAX`), ``none`` none of them.

Pure: no Kafka, no Redis (the durable book of schedules and the ticker are
:mod:`runlog.processors.schedule`).
"""

from __future__ import annotations

import calendar
import functools
import json
import re
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from runlog.schemas.errors import ConfigError

__all__ = ["CATCH_UP", "CATCH_UP_MAX", "CRON_LOOKBACK_MS", "ON_TIME_MS", "Cron", "Schedule", "parse_every"]

CATCH_UP = ("one", "all", "none")
"""The catch-up policies of missed ticks."""
CATCH_UP_MAX = 1000
"""At most this many missed ticks are started under ``catch_up="all"`` (the latest ones)."""
ON_TIME_MS = 60_000
"""A tick seen within this long after its time is on time; an older one was missed."""
CRON_LOOKBACK_MS = 31 * 86_400_000
"""How far back a cron schedule looks for missed ticks."""

_FIELDS = (("minute", 0, 59), ("hour", 0, 23), ("day of month", 1, 31), ("month", 1, 12),
           ("day of week", 0, 7))


def _field(text: str, name: str, lo: int, hi: int) -> frozenset[int]:
    out: set[int] = set()
    for part in text.split(","):
        m = re.fullmatch(r"(\*|\d+(?:-\d+)?)(?:/(\d+))?", part)
        if m is None:
            raise ConfigError(f"cron {name} field: {part!r} is not *, N, N-M, or one of them /STEP")
        rng, step_s = m.groups()
        step = int(step_s) if step_s is not None else 1
        if step < 1:
            raise ConfigError(f"cron {name} field: step must be >= 1 in {part!r}")
        if rng == "*":
            a, b = lo, hi
        elif "-" in rng:
            a, b = (int(x) for x in rng.split("-"))
        else:
            a = b = int(rng)
            if step_s is not None:
                b = hi  # N/STEP: from N to the end
        if not (lo <= a <= hi and lo <= b <= hi) or a > b:
            raise ConfigError(f"cron {name} field: {part!r} is outside {lo}-{hi}")
        out.update(range(a, b + 1, step))
    return frozenset(out)


@dataclass(frozen=True, slots=True)
class Cron:
    """A 5-field cron expression (minute hour day-of-month month day-of-week), in UTC.

    Each field is ``*``, a number, a range ``N-M``, any of them with a step ``/S``, or a comma
    list of those; day of week 0-7 (0 and 7 are Sunday). As in classic cron, when both day of
    month and day of week are restricted (neither is ``*``), a day matching either one matches.
    """

    expression: str
    minutes: frozenset[int]
    hours: frozenset[int]
    days: frozenset[int]
    months: frozenset[int]
    weekdays: frozenset[int]
    any_day: bool
    any_weekday: bool

    @classmethod
    def parse(cls, expression: str) -> Cron:
        """Parse ``expression``.

        Raises:
            ConfigError: not five fields, or a field that is malformed or out of range.
        """
        parts = expression.split()
        if len(parts) != 5:
            raise ConfigError(f"cron expression {expression!r} must have 5 fields "
                              "(minute hour day-of-month month day-of-week)")
        sets = [_field(p, n, lo, hi) for p, (n, lo, hi) in zip(parts, _FIELDS, strict=True)]
        weekdays = frozenset(d % 7 for d in sets[4])
        return cls(" ".join(parts), sets[0], sets[1], sets[2], sets[3], weekdays,
                   parts[2] == "*", parts[4] == "*")

    def _day_ok(self, year: int, month: int, day: int) -> bool:
        if month not in self.months:
            return False
        dom = day in self.days
        dow = (calendar.weekday(year, month, day) + 1) % 7 in self.weekdays  # Monday=0 -> 1
        if self.any_day and self.any_weekday:
            return True
        if self.any_day:
            return dow
        if self.any_weekday:
            return dom
        return dom or dow

    def next_after(self, ms: int) -> int:
        """The first matching minute strictly after ``ms`` (epoch ms), as epoch ms.

        Raises:
            ConfigError: nothing matches in the next eight years (e.g. ``0 0 31 2 *``).
        """
        t = (ms // 60_000 + 1) * 60  # the next whole minute, epoch seconds
        st = time.gmtime(t)
        year, month, day, hour, minute = st.tm_year, st.tm_mon, st.tm_mday, st.tm_hour, st.tm_min
        for _ in range(366 * 8):
            if self._day_ok(year, month, day):
                for h in sorted(x for x in self.hours if x >= hour):
                    for m in sorted(x for x in self.minutes if h > hour or x >= minute):
                        return calendar.timegm((year, month, day, h, m, 0)) * 1000
            hour = minute = 0
            day += 1
            if day > calendar.monthrange(year, month)[1]:
                day, month = 1, month + 1
                if month > 12:
                    month, year = 1, year + 1
        raise ConfigError(f"cron expression {self.expression!r} matches no time in eight years")


@functools.lru_cache(maxsize=256)
def _parsed(expression: str) -> Cron:
    return Cron.parse(expression)


def parse_every(text: str | float) -> float:
    """A period as ``2s``, ``5m``, ``1h``, ``1d`` or a number of seconds; returns seconds.

    Raises:
        ConfigError: not such a period, or not > 0.
    """
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        seconds = float(text)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", str(text))
        if m is None:
            raise ConfigError(f"--every {text!r}: give a period like 2s, 5m, 1h or 1d")
        seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]
    if not seconds > 0:
        raise ConfigError(f"a schedule's period must be > 0 seconds, got {text!r}")
    return seconds


@dataclass(frozen=True, slots=True)
class Schedule:
    """One schedule: start a run of ``workflow`` with ``params`` on every tick.

    Exactly one of ``cron`` (5-field, UTC) and ``every`` (seconds) is set. ``created_at_ms``: the
    first tick is the first one after it (a new schedule does not catch up on the past).
    """

    name: str
    workflow: str
    params: Mapping[str, Any] = field(default_factory=dict)
    cron: str | None = None
    every: float | None = None
    catch_up: str = "one"
    paused: bool = False
    created_at_ms: int = 0

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[A-Za-z0-9_.\-]+", self.name):
            raise ConfigError(f"schedule name {self.name!r}: use letters, digits, '.', '_' or '-'")
        if not self.workflow:
            raise ConfigError(f"schedule {self.name!r} needs a workflow")
        if (self.cron is None) == (self.every is None):
            raise ConfigError(f"schedule {self.name!r}: give exactly one of a cron expression and a period")
        if self.cron is not None:
            Cron.parse(self.cron)
        if self.every is not None:
            parse_every(self.every)
        if self.catch_up not in CATCH_UP:
            raise ConfigError(f"schedule {self.name!r}: catch_up must be one of {', '.join(CATCH_UP)}, "
                              f"got {self.catch_up!r}")
        if not isinstance(self.params, Mapping):
            raise ConfigError(f"schedule {self.name!r}: params must be a JSON object")
        object.__setattr__(self, "params", dict(self.params))

    @property
    def clock(self) -> str:
        """How it ticks, for people: ``cron 0 2 * * *`` or ``every 2s``."""
        return f"cron {self.cron}" if self.cron is not None else f"every {self.every:g}s"

    def next_after(self, ms: int) -> int:
        """The first tick strictly after ``ms`` (epoch ms)."""
        if self.cron is not None:
            return _parsed(self.cron).next_after(ms)
        period = self._period_ms()
        return (ms // period + 1) * period

    def ticks(self, after_ms: int, upto_ms: int) -> Iterator[int]:
        """Every tick in ``(after_ms, upto_ms]``, oldest first."""
        t = self.next_after(after_ms)
        while t <= upto_ms:
            yield t
            t = self.next_after(t)

    def due(self, last_ms: int | None, now_ms: int) -> list[int]:
        """The ticks to start now, oldest first: every tick on time (in the last :data:`ON_TIME_MS`)
        after ``last_ms`` (the latest tick already handled; None: none yet, the schedule's creation
        counts), and before them the missed ones the catch-up policy keeps (``one``: the latest,
        ``all``: up to :data:`CATCH_UP_MAX` of the latest, ``none``: none; a cron schedule looks back
        at most :data:`CRON_LOOKBACK_MS`)."""
        after = max(last_ms or 0, self.created_at_ms)
        edge = now_ms - ON_TIME_MS
        on_time = list(self.ticks(max(after, edge), now_ms))
        if self.catch_up == "none" or after >= edge:
            return on_time
        if self.every is not None:
            start = max(after, edge - (CATCH_UP_MAX + 1) * self._period_ms())
        else:
            start = max(after, edge - CRON_LOOKBACK_MS)
        missed = list(self.ticks(start, edge))
        keep = CATCH_UP_MAX if self.catch_up == "all" else 1
        return missed[-keep:] + on_time

    def _period_ms(self) -> int:
        assert self.every is not None
        return max(1, round(self.every * 1000))

    def run_key(self, tick_ms: int) -> str:
        """The idempotency key of the run of tick ``tick_ms``: one run per schedule and tick."""
        return f"schedule:{self.name}:{tick_ms}"

    def to_json(self) -> str:
        return json.dumps({"name": self.name, "workflow": self.workflow, "params": dict(self.params),
                           "cron": self.cron, "every": self.every, "catch_up": self.catch_up,
                           "paused": self.paused, "created_at_ms": self.created_at_ms}, sort_keys=True)

    @classmethod
    def from_json(cls, raw: str | bytes) -> Schedule:
        d = json.loads(raw)
        return cls(name=d["name"], workflow=d["workflow"], params=d.get("params") or {}, cron=d.get("cron"),
                   every=d.get("every"), catch_up=d.get("catch_up", "one"), paused=bool(d.get("paused")),
                   created_at_ms=int(d.get("created_at_ms", 0)))
