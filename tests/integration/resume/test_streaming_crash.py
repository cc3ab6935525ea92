"""Durable streaming against the real broker and Redis: a streaming agent run SIGKILLed mid-stream
and resumed (tests/integration/resume/_streaming_agent.py), read by a follower from offset 0."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runlog.processors.inspect import run_history
from runlog.processors.streams import StreamReader, superseded
from runlog.producers import LocalArtifactStore
from runlog.schemas import EventType, Settings, StreamKind, StreamRecord
from tests.integration.resume._streaming_agent import ANSWER, CHUNKS, MODEL_TOOL, spawn, talk_app
from tests.integration.resume._workers import finish, resume_after_crash

pytestmark = [pytest.mark.integration]

T = EventType


def test_a_run_killed_mid_stream_marks_its_partial_output_superseded_and_streams_anew(
        topics: Settings, tmp_path: Path) -> None:
    settings = topics.with_(lease_ttl_ms=1000)
    rc, out = finish(spawn(settings, tmp_path / "world", kill_after=5), tmp_path / "worker.log")
    assert rc == -9, out
    run_id = next(line.split("=", 1)[1] for line in out.splitlines() if line.startswith("run_id="))
    res = resume_after_crash(settings, talk_app(tmp_path / "world"), run_id)
    assert res.result == "completed", res.detail
    with StreamReader(settings, run_id, from_offset=0) as reader:
        entries = list(reader.follow(idle_timeout=5, until_final=True))
    records: list[StreamRecord] = [e.record for e in entries if e.record is not None]
    assert all(e.error is None for e in entries)
    call_id = f"answer/{MODEL_TOOL}/0"
    assert {r.call_id for r in records} == {call_id}
    first = [r for r in records if r.epoch == records[0].epoch]
    second = [r for r in records if r.epoch > records[0].epoch]
    # the first attempt: BEGIN and the 5 chunks it streamed, no FINAL
    assert [r.text for r in first if r.kind is StreamKind.DELTA] == CHUNKS[:5]
    assert StreamKind.FINAL not in {r.kind for r in first}
    # the resumed attempt: SUPERSEDED naming the call, then the full answer and FINAL
    assert second[0].kind is StreamKind.SUPERSEDED and second[0].call_id == call_id
    assert [r.kind for r in second[:2]] == [StreamKind.SUPERSEDED, StreamKind.BEGIN]
    assert "".join(r.text or "" for r in second if r.kind is StreamKind.DELTA) == ANSWER
    assert second[-1].kind is StreamKind.FINAL
    # a reader acting on SUPERSEDED drops exactly the first attempt's records
    assert superseded(records) == set(range(len(first)))
    # the stage's output is the recorded final response, which the FINAL record carries
    evs = [le.event for le in run_history(settings, run_id) if le.outcome.accepted]
    [verified] = [e for e in evs if e.type is T.VERIFIED]
    assert verified.payload_ref is not None
    store = LocalArtifactStore(settings.artifact_root)
    assert json.loads(store.get(verified.payload_ref)) == {"answer": ANSWER}
    results = [e for e in evs if e.type is T.TOOL_RESULT and e.tool == MODEL_TOOL]
    assert len(results) == 1 and results[0].payload_ref is not None
    recorded = json.loads(store.get(results[0].payload_ref))
    assert json.loads(second[-1].data or "") == recorded
    assert [p["content"] for p in recorded["parts"]] == [ANSWER]
