"""The console's live view of a run's streamed output (``/runs/RUN/stream``) against the real
broker: server-sent events whose ids are stream offsets, resumed after a disconnect from
``Last-Event-ID`` with no gap and no duplicate, and an undecodable record reported."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from confluent_kafka import Producer

from runlog.producers.streams import StreamWriter
from runlog.schemas import Settings, Topics
from tests.integration.console.conftest import console


async def _events(resp: Any, n: int) -> list[tuple[str, int, dict[str, Any]]]:
    out: list[tuple[str, int, dict[str, Any]]] = []
    while len(out) < n:
        block = (await asyncio.wait_for(resp.content.readuntil(b"\n\n"), 30)).decode()
        if block.startswith(":"):
            continue
        fields = dict(line.split(": ", 1) for line in block.strip().splitlines())
        out.append((fields["event"], int(fields["id"]), json.loads(fields["data"])))
    return out


def test_the_stream_view_resumes_from_last_event_id_and_reports_an_undecodable_record(
        topics: Settings) -> None:
    p = Producer(topics.producer_config())
    p.produce(Topics.of(topics).streams, key=b"run-v", value=b"\x00garbage")
    assert p.flush(30) == 0
    writer = StreamWriter.from_settings(topics)
    a = writer.begin(run_id="run-v", stage="s", call_id="s/model/0", epoch=1, attempt=1, supersedes=False)
    for i in range(8):
        a.delta(0, f"t{i} ")
    a.final("{}")
    assert writer.flush(30) == 0

    async def go() -> None:
        async with console(topics) as client:
            async with client.get("/runs/run-v/stream?from=0") as live:
                assert live.headers["Content-Type"] == "text/event-stream"
                first = await _events(live, 5)  # then the connection drops
            assert first[0][0] == "undecodable" and first[0][2]["reason"] in ("unknown_schema", "truncated",
                                                                             "invalid_body")
            assert [e[2]["kind"] for e in first[1:]] == ["BEGIN", "DELTA", "DELTA", "DELTA"]
            assert all(e[1] == e[2]["offset"] for e in first)
            last = first[-1][1]
            async with client.get("/runs/run-v/stream", headers={"Last-Event-ID": str(last)}) as again:
                rest = await _events(again, 6)
            assert [e[2]["kind"] for e in rest] == [*["DELTA"] * 5, "FINAL"]
            offsets = [e[1] for e in first + rest]
            assert offsets == sorted(set(offsets)) and rest[0][1] == last + 1
            texts = [e[2]["text"] for e in first + rest if e[2].get("kind") == "DELTA"]
            assert texts == [f"t{i} " for i in range(8)]
            bad = await client.get("/runs/run-v/stream?from=-1")
            assert bad.status == 400

    asyncio.run(go())
