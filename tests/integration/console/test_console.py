"""``runlog console`` over HTTP (aiohttp's test client), against the real broker and Redis.

What each test would catch:

* the list: runs missing from the page, filters or search that do not filter, the
  blocked/waiting panel missing;
* a run's page: a timeline that is not the log's (stages, events, checkpoints, effects);
* the guard: an action taken without the token, with a wrong one, from another site (bad or
  missing Origin, cross-site fetch metadata), without the session's CSRF token or without a
  name, or with no token configured; every refusal must leave the log as it was;
* credentials: any settings secret (SASL password and user, console token) in any response,
  even one that echoes what a person typed;
* live: a run page's stream that does not deliver events appended after the page was drawn;
* health: group lag, dead letters, the projection marker not read from Kafka and Redis;
* remote: a console on a non-loopback address that serves pages without a sign-in, or a
  loopback console answering a foreign Host (DNS rebinding).
"""

from __future__ import annotations

import asyncio
import json
import re
import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from runlog.processors.console import ConsoleOptions, serve
from runlog.processors.inspect import run_history
from runlog.projections import OutcomeKind
from runlog.schemas import ConfigError, EventType, Settings, Topics, partition_for
from tests.integration.console import _flows
from tests.integration.console.conftest import TOKEN, console, csrf_of, log_size, origin, post_action, project

pytestmark = pytest.mark.integration


def _types(settings: Settings, run_id: str) -> list[EventType]:
    return [h.event.type for h in run_history(settings, run_id) if h.outcome.kind is OutcomeKind.ACCEPTED]


def _rows(html: str) -> dict[str, str]:
    """run id -> status of every run row in the main table."""
    table = html.split('class="runs-table"', 1)[-1] if 'class="runs-table"' in html else ""
    return dict(re.findall(r'<tr class="run-row" data-run="([^"]+)" data-status="([A-Z]+)">', table))


def test_the_list_shows_runs_by_status_with_filters_and_search_and_a_run_page_draws_its_log(
        console_settings: Settings) -> None:
    s = console_settings
    done = _flows.completed(s, name="alpha", q="kiwi")
    broken = _flows.failed(s, name="beta")
    waiting = _flows.approval(s, name="gamma")
    project(s)

    async def go() -> None:
        async with console(s) as client:
            html = await (await client.get("/")).text()
            assert _rows(html) == {done: "COMPLETED", broken: "FAILED", waiting: "WAITING"}
            attention = html.split('class="attention"', 1)[1].split("</section>", 1)[0]
            assert waiting in attention and "waits for signal <b>approval</b>" in attention
            assert broken in attention and "Retry / cancel" in attention
            assert done not in attention

            assert _rows(await (await client.get("/?status=FAILED")).text()) == {broken: "FAILED"}
            assert _rows(await (await client.get("/?workflow=alpha@1")).text()) == {done: "COMPLETED"}
            assert _rows(await (await client.get("/?q=disk+is+full")).text()) == {broken: "FAILED"}
            assert _rows(await (await client.get(f"/?q={done[-8:].upper()}")).text()) == {done: "COMPLETED"}
            assert (await client.get("/?status=NOPE")).status == 400
            part = await (await client.get("/runs?status=WAITING")).text()
            assert _rows(part) == {waiting: "WAITING"} and "<html" not in part
            doc = await (await client.get("/api/runs")).json()
            assert doc["counts"]["COMPLETED"] == 1 and doc["counts"]["FAILED"] == 1
            assert [(r["status"], r["waiting_for"]) for r in doc["attention"]] == [("WAITING", "approval"),
                                                                                  ("FAILED", "")]

            page = await (await client.get(f"/runs/{done}")).text()
            drawn = re.findall(r'data-seq="(\d+)" data-epoch="\d+" data-offset="\d+" data-type="([A-Z_]+)"',
                               page)
            assert [t for _, t in drawn] == [t.value for t in _types(s, done)]
            assert [int(q) for q, _ in drawn] == list(range(1, len(drawn) + 1))
            assert re.findall(r'<li class="stage (\w+)" data-stage="(\w+)"', page) == [
                ("verified", "fetch"), ("verified", "send")]
            assert page.count('<tr class="checkpoint">') == 2
            assert 'data-status="COMPLETED"' in page and "m-kiwi" in page  # the effect's external id
            assert "Nothing to do: the run is COMPLETED" in page

            failed_page = await (await client.get(f"/runs/{broken}")).text()
            assert "ValueError: the disk is full (terminal)" in failed_page
            assert 'id="retry-disabled"' in failed_page  # no --app: the retry button is disabled
            assert (await client.get("/runs/run-nobody")).status == 404
            one = await (await client.get(f"/api/runs/{done}?after=3")).json()
            assert one["status"] == "COMPLETED" and one["events"][0]["seq"] == 4

    asyncio.run(go())


def test_actions_need_the_token_the_same_origin_the_sessions_csrf_token_and_a_name(
        console_settings: Settings) -> None:
    s = console_settings
    run_id = _flows.failed(s)
    path = f"/runs/{run_id}/cancel"

    async def go() -> None:
        async with console(s) as client:
            csrf = await csrf_of(client, f"/runs/{run_id}")
            good = {"csrf": csrf, "token": TOKEN, "by": "ops-alice", "reason": "disk will not recover"}
            before = log_size(s)
            refused: list[tuple[dict[str, str], dict[str, str], int, str]] = [
                ({**good, "token": ""}, {}, 403, "console token is required"),
                ({**good, "token": TOKEN + "x"}, {}, 403, "wrong console token"),
                (good, {"Origin": "http://evil.example"}, 403, "cross-site request refused"),
                (good, {"Origin": "", "Referer": ""}, 403, "neither Origin nor Referer"),
                (good, {"Origin": "", "Referer": "http://evil.example/page"}, 403, "Referer is not"),
                (good, {"Sec-Fetch-Site": "cross-site"}, 403, "Sec-Fetch-Site: cross-site"),
                ({**good, "csrf": ""}, {}, 403, "CSRF token or the session cookie is missing"),
                ({**good, "csrf": "0" * 64}, {}, 403, "does not belong to this session"),
                ({**good, "by": " "}, {}, 400, "'by' field is required"),
            ]
            for fields, headers, status, words in refused:
                resp = await post_action(client, path, fields, headers=headers)
                doc = await resp.json()
                assert (resp.status, doc["ok"]) == (status, False), (fields, headers, doc)
                assert words in doc["message"], doc
            # another session's CSRF token is refused too
            async with console(s) as other:
                foreign = await csrf_of(other, "/")
            resp = await post_action(client, path, {**good, "csrf": foreign})
            assert resp.status == 403  # another session's (and another console's) token
            assert log_size(s) == before, "a refused action appended something"
            assert _types(s, run_id)[-1] is EventType.FAILED

            resp = await post_action(client, path, good)  # every check passes: the CLI's cancel runs
            doc = await resp.json()
            assert resp.status == 200 and doc["ok"], doc
            assert doc["result"]["action"] == "cancel" and "cancelled by ops-alice" in doc["message"]
            history = [h for h in run_history(s, run_id) if h.outcome.kind is OutcomeKind.ACCEPTED]
            last = history[-1].event
            assert last.type is EventType.RUN_CANCELLED
            assert last.attributes["by"] == "ops-alice"
            assert last.attributes["reason"] == "disk will not recover"

            size = log_size(s)
            resp = await post_action(client, path, good)  # the function refuses: 409, nothing appended
            doc = await resp.json()
            assert resp.status == 409 and "nothing to cancel" in doc["message"], doc
            resp = await post_action(client, f"/runs/{run_id}/retry", good, json=False)  # no --app
            page = await resp.text()
            assert resp.status == 409 and "retry needs the application" in page and "<html" in page
            assert log_size(s) == size

    asyncio.run(go())


def test_without_a_configured_token_pages_read_and_every_action_is_refused(topics: Settings) -> None:
    s = topics  # console_token None
    run_id = _flows.approval(s)

    async def go() -> None:
        async with console(s) as client:
            page = await (await client.get(f"/runs/{run_id}")).text()
            assert "actions disabled: RUNLOG_CONSOLE_TOKEN is not set" in page
            assert 'data-action="approve"' in page and "disabled" in page
            csrf = await csrf_of(client, f"/runs/{run_id}")
            before = log_size(s)
            for action in ("approve", "reject", "signal", "cancel", "resolve", "retry"):
                resp = await post_action(client, f"/runs/{run_id}/{action}",
                                         {"csrf": csrf, "token": "anything", "by": "ops", "reason": "r",
                                          "name": "approval", "data": "{}", "key": "k", "outcome": "done"})
                doc = await resp.json()
                assert resp.status == 403 and "RUNLOG_CONSOLE_TOKEN is not set" in doc["message"], doc
            assert log_size(s) == before

    asyncio.run(go())


def test_approve_signals_a_waiting_run_through_the_same_function_as_the_cli(
        console_settings: Settings) -> None:
    s = console_settings
    run_id = _flows.approval(s)

    async def go() -> None:
        async with console(s) as client:
            csrf = await csrf_of(client, f"/runs/{run_id}")
            fields = {"csrf": csrf, "token": TOKEN, "by": "ops-bob", "reason": "looks right"}
            resp = await post_action(client, f"/runs/{run_id}/signal", {**fields, "name": "approval",
                                                                         "data": "{not json"})
            assert resp.status == 409 and "not JSON" in (await resp.json())["message"]
            resp = await post_action(client, f"/runs/{run_id}/approve", {**fields, "name": "approval"})
            doc = await resp.json()
            assert resp.status == 200 and doc["ok"] and doc["result"]["action"] == "signal:approval", doc

    asyncio.run(go())
    last = [h.event for h in run_history(s, run_id) if h.outcome.kind is OutcomeKind.ACCEPTED][-1]
    assert last.type is EventType.SIGNAL_RECEIVED
    assert (last.attributes["by"], last.attributes["signal"]) == ("ops-bob", "approval")


def test_no_credential_appears_in_any_response(topics: Settings) -> None:
    secrets = {"sasl.password": "sasl-pw-" + uuid.uuid4().hex,
               "sasl.username": "svc-" + uuid.uuid4().hex[:12]}
    s = topics.with_(console_token=TOKEN, kafka_extra=secrets)
    done = _flows.completed(s)
    waiting = _flows.approval(s)
    project(s)
    leaks = [*secrets.values(), TOKEN]

    def clean(where: str, text: str) -> None:
        for secret in leaks:
            assert secret not in text, f"{where} shows a credential"

    async def go() -> None:
        async with console(s) as client:
            for path in ("/", "/?status=COMPLETED", "/runs", "/health", "/health/part", "/api/runs",
                         "/api/health", "/versions", "/versions/part", "/api/versions", f"/runs/{done}",
                         f"/runs/{waiting}", f"/api/runs/{done}",
                         "/runs/run-nobody", "/login", "/static/console.js", "/static/console.css", "/nope"):
                resp = await client.get(path)
                clean(path, await resp.text())
                clean(f"{path} headers", json.dumps(dict(resp.headers)))
            async with client.get(f"/runs/{done}/live?after=0") as live:
                first = await asyncio.wait_for(live.content.readuntil(b"\n\n"), 30)
                assert first.startswith(b"event: update")
                clean("live", first.decode())
            # a person typing a secret into a field: the refusal echoes the field, masked
            csrf = await csrf_of(client, f"/runs/{waiting}")
            for typed in leaks:
                for accept_json in (True, False):
                    resp = await post_action(client, f"/runs/{waiting}/approve",
                                             {"csrf": csrf, "token": TOKEN, "by": "ops", "name": typed},
                                             json=accept_json)
                    body = await resp.text()
                    assert resp.status == 409 and "waits for signal" in body and "***" in body, body
                    clean("an action's answer", body)

    asyncio.run(go())


def test_the_live_stream_delivers_events_appended_after_the_page_was_drawn(
        console_settings: Settings) -> None:
    s = console_settings
    held = _flows.gated(s)
    run_id = held.start()

    async def go() -> None:
        async with console(s) as client:
            page = await (await client.get(f"/runs/{run_id}")).text()
            drawn = int(re.search(r'data-events="(\d+)"', page).group(1))  # type: ignore[union-attr]
            assert 'data-type="TOOL_CALLED"' in page and 'data-type="RUN_COMPLETED"' not in page
            async with client.get(f"/runs/{run_id}/live?after={drawn}") as live:
                assert live.headers["Content-Type"].startswith("text/event-stream")
                await asyncio.sleep(0.5)  # the stream has nothing new to say yet
                assert live.content.at_eof() is False and not live.content.is_eof()
                await asyncio.to_thread(held.open)  # the run goes on: TOOL_RESULT ... RUN_COMPLETED
                seen: list[str] = []
                deadline = time.monotonic() + 30
                while "RUN_COMPLETED" not in seen:
                    assert time.monotonic() < deadline, f"no update with RUN_COMPLETED; last drew {seen}"
                    chunk = await asyncio.wait_for(live.content.readuntil(b"\n\n"), 30)
                    if not chunk.startswith(b"event: update"):
                        continue
                    data = "".join(line[len("data: "):] for line in chunk.decode().splitlines()
                                   if line.startswith("data: "))
                    doc = json.loads(data)
                    assert doc["events"] > drawn
                    seen = re.findall(r'data-type="([A-Z_]+)"', doc["parts"]["run-timeline"])
                assert seen == [t.value for t in _types(s, run_id)]
                assert doc["status"] == "COMPLETED" and "Nothing to do" in doc["actions"]

    asyncio.run(go())


def test_health_shows_group_lag_dead_letters_and_the_projection(console_settings: Settings) -> None:
    s = console_settings.with_(resumer_group=f"t-{uuid.uuid4().hex[:8]}-resumer")
    names = Topics.of(s)
    run_id = _flows.completed(s)
    project(s)
    p = Producer(s.producer_config())
    for i in range(3):
        p.produce(names.dlq, key=b"k", value=b"junk", headers=[("runlog.error.reason", b"invalid_body"),
                                                               ("runlog.error.detail", f"junk {i}".encode())])
    p.produce(names.resume, key=run_id.encode(), value=b"x")
    assert p.flush(30) == 0
    # a "projector" group that committed all but the last record of the run's partition, and a
    # resumer group that committed nothing yet on the resume topic (lag 1)
    last = run_history(s, run_id)[-1].offset  # the run is alone on its partition
    partition = partition_for(run_id, s.partitions)
    projector = f"t-proj-{uuid.uuid4().hex[:8]}"
    commits = ((projector, names.events, last), (f"{s.resumer_group}.orders", names.resume, 0))
    for group, topic, offset in commits:
        c = Consumer(s.consumer_config(group))
        c.commit(offsets=[TopicPartition(topic, partition, offset)], asynchronous=False)
        c.close()

    async def go() -> None:
        async with console(s, projector_groups=(projector, "t-absent-projector")) as client:
            doc = await (await client.get("/api/health")).json()
            # the console shows the group ids, which carry the topic prefix (Settings.group_id)
            groups = {g["group"].removeprefix(s.topic_prefix): g for g in doc["groups"]}
            assert all(g["group"].startswith(s.topic_prefix) for g in doc["groups"])
            assert groups[projector]["lag"] == 1 and groups[projector]["role"] == "projector"
            assert groups["t-absent-projector"]["state"] == "absent"
            assert groups["t-absent-projector"]["lag"] == log_size(s)
            resumer = groups[f"{s.resumer_group}.orders"]
            assert (resumer["role"], resumer["lag"]) == ("resumer", 1)
            assert doc["dead_letters"] == 3
            assert [d["detail"] for d in doc["latest_dead_letters"]] == ["junk 2", "junk 1", "junk 0"]
            assert doc["marker"] == "ready" and doc["counts"]["COMPLETED"] == 1 and not doc["errors"]
            assert "metrics are off" in doc["projector_metrics"]["error"]
            page = await (await client.get("/health")).text()
            assert f'data-group="{s.group_id(projector)}" data-lag="1"' in page
            assert 'id="dead-letters">3<' in page

    asyncio.run(go())


def test_a_console_beyond_loopback_needs_the_token_to_start_and_a_sign_in_to_read(
        console_settings: Settings) -> None:
    with pytest.raises(ConfigError, match="RUNLOG_CONSOLE_TOKEN"):
        serve(console_settings.with_(console_token=None), ConsoleOptions(host="0.0.0.0", port=1))

    async def go() -> None:
        async with console(console_settings, host="0.0.0.0") as client:
            resp = await client.get("/", allow_redirects=False)
            assert resp.status == 303 and resp.headers["Location"] == "/login"
            assert (await client.get("/api/runs", allow_redirects=False)).status == 303
            csrf = await csrf_of(client, "/login")
            resp = await post_action(client, "/login", {"csrf": csrf, "token": "wrong"}, json=False)
            assert resp.status == 403 and "wrong console token" in await resp.text()
            assert (await client.get("/", allow_redirects=False)).status == 303
            resp = await post_action(client, "/login", {"csrf": csrf, "token": TOKEN}, json=False)
            assert resp.status == 200 and str(resp.url).endswith("/")
            assert (await client.get("/api/runs")).status == 200
        async with console(console_settings) as client:  # loopback: a foreign Host is not answered
            assert (await client.get("/", headers={"Host": "evil.example:8470"})).status == 421
            assert (await client.get("/", headers={"Host": f"localhost:{client.port}"})).status == 200
            assert origin(client).startswith("http://127.0.0.1:")

    asyncio.run(go())


def test_the_public_names_are_pinned() -> None:
    import runlog.processors.console as c

    assert sorted(c.__all__) == ["Console", "ConsoleOptions", "make_app", "serve"]
