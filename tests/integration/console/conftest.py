"""Fixtures of the console tests: the console on aiohttp's test server, forms, the log's size."""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer
from confluent_kafka import Consumer, KafkaException

from runlog.processors.console import ConsoleOptions, make_app
from runlog.processors.resume import App
from runlog.schemas import Settings, Topics
from tests.integration.producers.helpers import watermarks
from tests.integration.resume import conftest as resume_conftest
from tests.integration.resume.conftest import DemoWorld, served_world

TOKEN = "console-token-" + "7f3a9c"
"""The console token of the tests' settings."""

_CSRF = re.compile(r'<meta name="csrf-token" content="([0-9a-f]+)">')


@pytest.fixture
def console_settings(topics: Settings) -> Settings:
    """``topics`` with the console token :data:`TOKEN`."""
    return topics.with_(console_token=TOKEN)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[DemoWorld]:
    """One demo world (payments, ...) served on 127.0.0.1, as the resume tests have it."""
    with served_world(tmp_path / "world") as w:
        yield w


@asynccontextmanager
async def console(settings: Settings, *, app: App | None = None,
                  **options: Any) -> AsyncIterator[TestClient[Any, Any]]:
    """The console on a test server at 127.0.0.1 and a client with a cookie jar."""
    opts = ConsoleOptions(**{"poll_interval_s": 0.2, **options})
    async with TestClient(TestServer(make_app(settings, opts, app=app), host="127.0.0.1")) as client:
        yield client


def origin(client: TestClient[Any, Any]) -> str:
    return str(client.make_url("/")).rstrip("/")


async def csrf_of(client: TestClient[Any, Any], path: str) -> str:
    """Load a page (which sets the session cookie) and return its CSRF token."""
    resp = await client.get(path)
    assert resp.status == 200, await resp.text()
    found = _CSRF.search(await resp.text())
    assert found, "no csrf token on the page"
    return found.group(1)


async def post_action(client: TestClient[Any, Any], path: str, fields: dict[str, str], *,
                      headers: dict[str, str] | None = None, json: bool = True) -> ClientResponse:
    """POST an action as the page's script does (same origin, JSON answer) unless told otherwise."""
    h = {"Origin": origin(client), "Sec-Fetch-Site": "same-origin"}
    if json:
        h["Accept"] = "application/json"
    h.update(headers or {})
    return await client.post(path, data=fields, headers={k: v for k, v in h.items() if v})


def project(settings: Settings) -> None:
    """Fold the events topic into Redis as the projector does (the resume tests' helper), waiting
    out partition leaders a new topic has not elected yet."""
    for attempt in range(20):
        try:
            resume_conftest.project(settings)
            return
        except KafkaException:
            if attempt == 19:
                raise
            time.sleep(0.5)


def log_size(settings: Settings) -> int:
    """Records on the events topic (sum of the high watermarks): it grows by every append."""
    topic = Topics.of(settings).events
    c = Consumer(settings.consumer_config(f"t-size-{uuid.uuid4().hex[:8]}"))
    try:
        parts = c.list_topics(topic, timeout=10).topics[topic].partitions
        return sum(watermarks(c, topic, p)[1] for p in parts)  # waits out leader elections
    finally:
        c.close()
