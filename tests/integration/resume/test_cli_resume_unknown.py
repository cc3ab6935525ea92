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


def test_resume_of_a_completed_run_refuses_and_requests_nothing(
        env: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    from runlog.producers import DictInputSource, Runner
    from runlog.schemas import Topics
    from tests.integration.resume._toy import toy as make

    t = make("beta")
    t.crashing = False
    with Runner.from_settings(env, source=DictInputSource({})) as runner:
        done = runner.run(t.workflow, {"q": "y"})
    assert done.completed
    requests_before = _resume_requests(env, Topics.of(env).resume)
    assert main(["resume", done.run_id]) == 1
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert f"run {done.run_id} is COMPLETED" in err and "nothing requested" in err
    assert _resume_requests(env, Topics.of(env).resume) == requests_before


def _resume_requests(settings: Settings, topic: str) -> int:
    """How many records the resume topic holds (the sum of its partitions' high watermarks)."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": settings.kafka_bootstrap_servers, "group.id": "count-only",
                  "enable.auto.commit": False})
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in parts)
    finally:
        c.close()
