"""The schedule clock on its own: the 5-field cron parser, ``every`` periods, and which ticks are
due under each catch-up policy."""

from __future__ import annotations

import calendar

import pytest

from runlog.producers.define._schedule import CATCH_UP_MAX, ON_TIME_MS, Cron, Schedule, parse_every
from runlog.schemas.errors import ConfigError


def ms(y: int, mo: int, d: int, h: int = 0, mi: int = 0) -> int:
    return calendar.timegm((y, mo, d, h, mi, 0)) * 1000


@pytest.mark.parametrize(("expr", "after", "expected"), [
    ("0 2 * * *", ms(2026, 1, 1, 1, 59), ms(2026, 1, 1, 2, 0)),
    ("0 2 * * *", ms(2026, 1, 1, 2, 0), ms(2026, 1, 2, 2, 0)),  # strictly after
    ("*/15 * * * *", ms(2026, 1, 1, 0, 16), ms(2026, 1, 1, 0, 30)),
    ("5,10-12 * * * *", ms(2026, 1, 1, 0, 10), ms(2026, 1, 1, 0, 11)),
    ("30 9 * * 1-5", ms(2026, 1, 3, 12), ms(2026, 1, 5, 9, 30)),  # Sat -> Mon
    ("0 0 * * 7", ms(2026, 1, 1), ms(2026, 1, 4)),  # 7 is Sunday
    ("0 0 29 2 *", ms(2026, 3, 1), ms(2028, 2, 29)),  # leap day
    ("0 0 1 */3 *", ms(2026, 2, 1), ms(2026, 4, 1)),
    ("0 12 13 * 5", ms(2026, 2, 1), ms(2026, 2, 6, 12)),  # day 13 or a Friday, as cron does
    ("59 23 31 12 *", ms(2026, 12, 31, 23, 59), ms(2027, 12, 31, 23, 59)),
    ("10/20 * * * *", ms(2026, 1, 1, 0, 31), ms(2026, 1, 1, 0, 50)),
])
def test_cron_next_after(expr: str, after: int, expected: int) -> None:
    assert Cron.parse(expr).next_after(after) == expected


@pytest.mark.parametrize("expr", ["", "* * * *", "60 * * * *", "* 24 * * *", "* * 0 * *", "* * * 13 *",
                                  "* * * * 8", "*/0 * * * *", "5-1 * * * *", "a * * * *", "1,,2 * * * *"])
def test_bad_cron_expressions_are_refused(expr: str) -> None:
    with pytest.raises(ConfigError):
        Cron.parse(expr)


def test_a_cron_that_never_matches_says_so() -> None:
    with pytest.raises(ConfigError, match="matches no time"):
        Cron.parse("0 0 31 2 *").next_after(0)


def test_periods() -> None:
    assert [parse_every(x) for x in ("2s", "5m", "1h", "1d", "1.5", 3)] == [2, 300, 3600, 86400, 1.5, 3]
    for bad in ("0s", "soon", "-1", "2w"):
        with pytest.raises(ConfigError):
            parse_every(bad)


def _every(catch_up: str, created: int = 0) -> Schedule:
    return Schedule("s", "wf", every=10, catch_up=catch_up, created_at_ms=created)


def test_ticks_on_time_are_all_started_once() -> None:
    s = _every("none")
    now = 1_000_000_000
    assert s.due(now - 35_000, now) == [now - 30_000, now - 20_000, now - 10_000, now]
    assert s.due(now, now + 9_999) == []


@pytest.mark.parametrize(("policy", "count"), [("none", 0), ("one", 1), ("all", 30)])
def test_missed_ticks_follow_the_catch_up_policy(policy: str, count: int) -> None:
    s = _every(policy)
    now = 10_000_000_000
    last = now - ON_TIME_MS - 300_000  # every member was down for five minutes before the window
    due = s.due(last, now)
    on_time = [t for t in due if t > now - ON_TIME_MS]
    missed = [t for t in due if t <= now - ON_TIME_MS]
    assert len(on_time) == 6 and len(missed) == count
    if missed:
        assert missed[-1] == now - ON_TIME_MS  # the latest missed tick is among them
    assert due == sorted(set(due))


def test_all_is_capped_and_a_new_schedule_does_not_catch_up_on_its_past() -> None:
    now = 10_000_000_000
    assert len(_every("all").due(0, now)) == CATCH_UP_MAX + 6
    assert _every("all", created=now + 1_000).due(None, now + 5_000) == []
    assert _every("one", created=now - 15_000).due(None, now) == [now - 10_000, now]


def test_schedule_validation_and_json() -> None:
    for kwargs in ({"every": 1, "cron": "* * * * *"}, {}, {"every": 1, "catch_up": "some"},
                   {"cron": "bad"}):
        with pytest.raises(ConfigError):
            Schedule("s", "wf", **kwargs)  # type: ignore[arg-type]
    with pytest.raises(ConfigError):
        Schedule("a b", "wf", every=1)
    s = Schedule("nightly", "review", {"k": 1}, cron="0 2 * * *", catch_up="all", created_at_ms=5)
    assert Schedule.from_json(s.to_json()) == s
    assert s.run_key(7) == "schedule:nightly:7" and s.clock == "cron 0 2 * * *"
