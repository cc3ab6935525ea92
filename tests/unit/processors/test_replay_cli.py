"""``runlog replay``'s argument parsing: ``--set`` values, ``--since`` times, and refusals of bad
usage before anything is read or run."""

from __future__ import annotations

import pytest

from runlog.processors.cli import main
from runlog.processors.cli.replay import parse_set, parse_since


def test_set_values_are_json_when_they_are_json_else_text() -> None:
    assert parse_set(["n=3", "t=0.2", "on=true", "tone=formal", 'q="x=y"', "empty="]) == {
        "n": 3, "t": 0.2, "on": True, "tone": "formal", "q": "x=y", "empty": ""}
    for bad in ("novalue", "=3", " =3"):
        with pytest.raises(ValueError, match="PARAM=VALUE"):
            parse_set([bad])


def test_since_is_epoch_milliseconds_or_an_iso_time_with_a_zone() -> None:
    assert parse_since("1700000000000") == 1_700_000_000_000
    assert parse_since("2026-12-01T00:00:00+00:00") == 1_796_083_200_000
    with pytest.raises(ValueError, match="no time zone"):
        parse_since("2026-12-01T00:00:00")


@pytest.mark.parametrize("argv", [
    ["replay", "--app", "x:y"],  # neither a run nor a cohort
    ["replay", "run-1", "--app", "x:y", "--workflow", "w", "--since", "0"],  # both
    ["replay", "--app", "x:y", "--workflow", "w"],  # a cohort without --since
    ["replay", "run-1", "--app", "x:y", "--set", "oops"],
    ["replay", "--app", "x:y", "--workflow", "w", "--since", "yesterday"],
])
def test_bad_usage_is_refused_with_exit_2_before_the_app_is_loaded(
        argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    assert "runlog replay:" in capsys.readouterr().err


def test_a_model_conversation_compares_without_its_times() -> None:
    from runlog.processors.replay import _compare

    def conversation(at: str, answer: str) -> dict[str, object]:
        return {"answer": answer, "messages": [
            {"kind": "request", "timestamp": at, "run_id": f"r-{at}", "parts": [
                {"part_kind": "user-prompt", "content": "price of a?", "timestamp": at}]},
            {"kind": "response", "timestamp": at, "parts": [{"part_kind": "text", "content": answer}]}]}

    recorded = conversation("2026-12-01T00:00:00Z", "1200")
    assert _compare(recorded, conversation("2026-12-06T07:00:00Z", "1200")) == "same"
    assert _compare(recorded, conversation("2026-12-06T07:00:00Z", "1300")) == "changed (answer, messages)"
    # a field named timestamp outside a model message is the workflow's own data: a change
    assert _compare({"timestamp": 1}, {"timestamp": 2}) == "changed (timestamp)"
