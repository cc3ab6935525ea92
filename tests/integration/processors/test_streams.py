"""The streams topic against the real broker: a reader resumes from an offset after a disconnect
with no gap and no duplicate (the Python client and ``runlog tail --from``), and a record that does
not decode is reported by ``runlog tail`` and goes to the dead-letter topic with its reason."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from runlog.processors.cli import main
from runlog.processors.dlq import parse_headers
from runlog.processors.streams import StreamReader
from runlog.producers.streams import StreamWriter
from runlog.schemas import Settings, StreamKind, Topics

pytestmark = [pytest.mark.integration]


def _write(settings: Settings, run_id: str, n: int, other: str | None = None) -> None:
    writer = StreamWriter.from_settings(settings)
    a = writer.begin(run_id=run_id, stage="s", call_id="s/model/0", epoch=1, attempt=1, supersedes=False)
    b = writer.begin(run_id=other, stage="s", call_id="s/model/0", epoch=1, attempt=1,
                     supersedes=False) if other else None
    for i in range(n):
        a.delta(0, f"t{i} ")
        if b is not None:
            b.delta(0, f"other{i} ")
    a.final("{}")
    assert writer.flush(30) == 0 and writer.failed == 0 and writer.dropped == 0


def test_a_reader_resumes_from_next_offset_without_gap_or_duplicate(topics: Settings) -> None:
    _write(topics, "run-a", 40, other="run-b")
    seen: list[int] = []
    texts: list[str] = []
    with StreamReader(topics, "run-a") as first:
        while len(seen) < 12:
            for e in first.poll(5.0, max_records=5):
                assert e.record is not None and e.run_id == "run-a"
                seen.append(e.offset)
                texts.append(e.record.text or "")
        resume = first.next_offset  # the disconnect: whatever was handed out is counted, nothing else
    with StreamReader(topics, "run-a", from_offset=resume) as second:
        for e in second.read_to_end():
            assert e.record is not None
            seen.append(e.offset)
            texts.append(e.record.text or "")
    assert len(seen) == len(set(seen)) == 42  # BEGIN, 40 deltas, FINAL: each once
    assert seen == sorted(seen)
    assert "".join(texts) == "".join(f"t{i} " for i in range(40))


def test_tail_of_a_run_nobody_knows_says_so(topics: Settings, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("RUNLOG_TRACEBACK", "1")  # an unexpected error shows where, in the failure
    _write(topics, "run-known", 2)  # the topics exist, with another run's records
    assert main(["tail", "run-nope"]) == 1
    out = capsys.readouterr()
    assert out.out == "" and out.err.strip().splitlines() == [
        "runlog tail: no run 'run-nope' in Redis or on the events topic"], out.err


def test_tail_from_an_offset_prints_exactly_the_rest(topics: Settings, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    _write(topics, "run-t", 20, other="run-u")
    assert main(["tail", "run-t", "--json"]) == 0
    out = capsys.readouterr()
    every = [json.loads(line) for line in out.out.splitlines()]
    assert [r["kind"] for r in every] == ["BEGIN", *["DELTA"] * 20, "FINAL"]
    cut = every[9]["offset"]  # a follower that printed ten records, then lost its connection
    assert main(["tail", "run-t", "--json", "--follow", "--until-final", "--from", str(cut + 1)]) == 0
    out = capsys.readouterr()
    rest = [json.loads(line) for line in out.out.splitlines()]
    assert every[:10] + rest == every
    assert f"next offset {every[-1]['offset'] + 1}" in out.err


def test_an_undecodable_stream_record_is_reported_and_dead_lettered(
        topics: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    t = Topics.of(topics)
    p = Producer(topics.producer_config())
    p.produce(t.streams, key=b"run-x", value=b"not avro")
    assert p.flush(30) == 0
    _write(topics, "run-x", 2)
    assert main(["tail", "run-x", "--json"]) == 1
    out = capsys.readouterr()
    lines = [json.loads(line) for line in out.out.splitlines()]
    assert lines[0]["error"] == "unknown_framing" and lines[0]["offset"] >= 0
    assert [r.get("kind") for r in lines[1:]] == ["BEGIN", "DELTA", "DELTA", "FINAL"]
    assert f"offset {lines[0]['offset']}: undecodable stream record (unknown_framing)" in out.err
    c = Consumer(topics.consumer_config("dlq-check"))
    try:
        parts = c.list_topics(t.dlq, timeout=10).topics[t.dlq].partitions
        c.assign([TopicPartition(t.dlq, q, 0) for q in parts])
        msg = None
        for _ in range(50):
            msg = c.poll(0.5)
            if msg is not None and msg.error() is None:
                break
        assert msg is not None and msg.error() is None
        assert msg.key() == b"run-x" and msg.value() == b"not avro"
        h = parse_headers(msg.headers())
        assert h["runlog.error.reason"] == "unknown_framing"
        assert h["runlog.original.topic"] == t.streams
        assert h["runlog.original.offset"] == str(lines[0]["offset"])
    finally:
        c.close()
    assert StreamKind.FINAL.value == lines[-1]["kind"]


def test_an_offset_past_the_end_is_refused_and_a_trimmed_start_is_named(
        topics: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    from confluent_kafka.admin import AdminClient

    from runlog.schemas import ConfigError

    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    _write(topics, "run-r", 6)
    with StreamReader(topics, "run-r") as reader:
        end = reader.end_offset()
        partition = reader.partition
    with pytest.raises(ConfigError, match=f"stream offset {end + 5} is past the end"):
        StreamReader(topics, "run-r", from_offset=end + 5)
    assert main(["tail", "run-r", "--from", str(end + 5)]) == 2
    assert "past the end" in capsys.readouterr().err
    # records deleted (as retention does): reading from 0 starts at the oldest kept, and says so
    admin = AdminClient(topics.admin_config())
    for f in admin.delete_records([TopicPartition(Topics.of(topics).streams, partition, 3)]).values():
        f.result(30)
    assert main(["tail", "run-r", "--json"]) == 0
    out = capsys.readouterr()
    offsets = [json.loads(line)["offset"] for line in out.out.splitlines()]
    assert offsets == list(range(3, 8))  # BEGIN 0, deltas 1-6, FINAL 7: from 3 on
    assert "records before offset 3 are no longer kept" in out.err


def test_until_final_means_the_runs_final_answer_not_its_first_model_call(
        topics: Settings, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An agent that calls a tool makes two model calls, each ending FINAL: ``--until-final`` stops
    after the run's last one, once the run has ended (here: completed on the log)."""
    from runlog.producers import DictInputSource, Runner
    from tests.integration.resume._toy import toy

    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    t = toy("streamer")
    t.crashing = False
    with Runner.from_settings(topics, source=DictInputSource({})) as runner:
        run_id = runner.run(t.workflow, {"q": "z"}).run_id
    writer = StreamWriter.from_settings(topics)
    for n, text in enumerate(["calling the tool", "the answer"]):  # the tool call, then the answer
        call = writer.begin(run_id=run_id, stage="s", call_id=f"s/model/{n}", epoch=1, attempt=1,
                            supersedes=False)
        call.delta(0, text)
        call.final(json.dumps({"text": text}))
    assert writer.flush(30) == 0
    assert main(["tail", run_id, "--json", "--follow", "--until-final", "--idle-timeout", "60"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["kind"], r["call_id"]) for r in records if r["kind"] == "FINAL"] == [
        ("FINAL", "s/model/0"), ("FINAL", "s/model/1")]
    assert records[-1]["kind"] == "FINAL" and records[-1]["call_id"] == "s/model/1"
