"""Crash points: matching an armed point, with or without its subject, and the in-process action."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from runlog.producers import crash


@pytest.fixture(autouse=True)
def _disarmed() -> Iterator[None]:
    yield
    crash.arm(None)
    crash.on_crash(None)
    crash.on_reach(None)


def test_a_point_with_its_subject_matches_only_itself() -> None:
    crash.arm("before:EFFECT_RESULT:deliver/send/0")
    assert crash.crash_point("before:EFFECT_RESULT:deliver/send/0")
    assert not crash.crash_point("before:EFFECT_RESULT:deliver/send/1")
    assert not crash.crash_point("after:EFFECT_RESULT:deliver/send/0")


def test_a_point_without_its_subject_matches_every_subject_of_that_event_only() -> None:
    crash.arm("before:EFFECT_RESULT")
    assert crash.crash_point("before:EFFECT_RESULT:deliver/send/0")
    assert crash.crash_point("before:EFFECT_RESULT:pay/charge/3")
    assert not crash.crash_point("before:EFFECT_RESULTS:x")
    assert not crash.crash_point("before:EFFECT_INTENT:deliver/send/0")


def test_unarmed_nothing_matches() -> None:
    crash.arm(None)
    assert not crash.crash_point("before:EFFECT_RESULT:deliver/send/0")


def test_the_action_gets_the_point_reached_and_replaces_the_kill() -> None:
    class Died(BaseException):
        pass

    def die(point: str) -> None:
        raise Died(point)

    crash.on_crash(die)
    crash.arm("inside:TOOL")
    assert crash.crash_point("inside:TOOL:write/compose/0")
    with pytest.raises(Died, match="inside:TOOL:write/compose/0"):
        crash.kill_self()


def test_a_reach_action_runs_once_at_the_point_and_the_run_goes_on() -> None:
    seen: list[str] = []
    crash.on_reach(seen.append)
    crash.arm("after:EFFECT_INTENT")
    assert not crash.crash_point("after:EFFECT_RESULT:publish/post/0")
    assert not crash.crash_point("after:EFFECT_INTENT:publish/post/0")  # reached: no crash
    assert seen == ["after:EFFECT_INTENT:publish/post/0"]
    assert crash.armed() is None
    assert not crash.crash_point("after:EFFECT_INTENT:publish/post/1")  # disarmed: once
    assert seen == ["after:EFFECT_INTENT:publish/post/0"]
