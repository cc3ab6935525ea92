"""``runlog resume RUN`` is loud about runs nobody knows, and finds runs only the log knows."""

from __future__ import annotations

import uuid

import pytest

from runlog.processors.cli import main
from runlog.schemas import Settings
from tests.integration.resume._toy import crash, toy, wait_events_topic_ready

pytestmark = pytest.mark.integration


@pytest.fixture
def env(topics: Settings, monkeypatch: pytest.MonkeyPatch) -> Settings:
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    wait_events_topic_ready(topics)
    return topics


def test_resume_of_an_unknown_run_exits_non_zero_with_one_line(
        env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    nobody = f"run-nobody-{uuid.uuid4().hex[:8]}"
    for args in (["resume", nobody], ["resume", nobody, "--dry-run"]):
        assert main(args) == 1
        out, err = capsys.readouterr()
        assert out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"runlog resume: no run {nobody!r}"), err


def test_resume_of_a_run_only_the_log_knows_is_requested(
        env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    run_id = crash(env, toy("alpha"))  # no projector: Redis has no state of it
    assert main(["resume", run_id]) == 0
    assert f"resume of {run_id} requested" in capsys.readouterr().out
