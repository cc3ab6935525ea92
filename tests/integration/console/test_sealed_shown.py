"""With payloads encrypted, the console opens sealed texts for an operator signed in with the console
token and shows ``[sealed]`` to everyone else: a failed run's reason in the run list and on the run's
page, and a run's streamed text in the live view (real broker and Redis)."""

from __future__ import annotations

import asyncio
import json
import uuid
from pathlib import Path
from typing import Any

import pytest

from runlog.producers import DictInputSource, Runner
from runlog.producers.internal import run_id_for_key
from runlog.producers.streams import StreamWriter
from runlog.schemas import RunFailed, Settings
from tests.integration.console.conftest import TOKEN, console, csrf_of, post_action, project
from tests.integration.console.test_stream_view import _events
from tests.integration.resume._toy import failing

pytestmark = pytest.mark.integration


def _failed_run(settings: Settings, secret: str) -> str:
    """A run whose tool fails with ``secret`` in its message: its id."""
    wf, _ = failing(f"sealedshown{uuid.uuid4().hex[:6]}")
    key = f"dora-{uuid.uuid4().hex}"
    with Runner.from_settings(settings, source=DictInputSource({})) as runner, \
            pytest.raises((ValueError, RunFailed)):
        runner.run(wf, {"q": secret}, subject="cust-dora", idempotency_key=key)
    return run_id_for_key(key)


async def _page(client: Any, path: str) -> str:
    resp = await client.get(path)
    assert resp.status == 200, path
    return str(await resp.text())


def test_sealed_reasons_and_streams_open_only_for_a_signed_in_operator(
        topics: Settings, tmp_path: Path) -> None:
    settings = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"), console_token=TOKEN)
    secret = f"4242-{uuid.uuid4().hex[:10]}"
    run_id = _failed_run(settings, secret)
    project(settings)
    writer = StreamWriter.from_settings(settings)
    attempt = writer.begin(run_id=run_id, stage="pay", call_id="pay/model/0", epoch=1, attempt=1,
                           supersedes=False, subject="cust-dora")
    attempt.delta(0, f"the answer is {secret}")
    attempt.final("{}")
    assert writer.flush(30) == 0

    async def stream_texts(client: Any) -> list[Any]:
        async with client.get(f"/runs/{run_id}/stream?from=0") as live:
            got = await _events(live, 3)
        return [e[2]["text"] for e in got if e[0] == "record" and e[2]["kind"] == "DELTA"]

    async def go() -> None:
        async with console(settings) as client:
            listed, page = await _page(client, "/runs?status=FAILED"), await _page(client, f"/runs/{run_id}")
            for text in (listed, page):
                assert secret not in text and "rlenc1:" not in text
                assert "card of [sealed]" in text or "[sealed]" in text
            assert await stream_texts(client) == ["[sealed]"]

            csrf = await csrf_of(client, "/login")
            resp = await post_action(client, "/login", {"csrf": csrf, "token": TOKEN}, json=False)
            assert resp.status == 200
            listed, page = await _page(client, "/runs?status=FAILED"), await _page(client, f"/runs/{run_id}")
            for text in (listed, page):
                assert f"card of {secret} declined" in text and "[sealed]" not in text
            assert await stream_texts(client) == [f"the answer is {secret}"]
            assert secret in json.dumps(await (await client.get("/api/runs")).json())
        async with console(settings) as other:  # a new session, not signed in: the JSON list is masked too
            body = json.dumps(await (await other.get("/api/runs")).json())
            assert secret not in body and "[sealed]" in body

    asyncio.run(go())
