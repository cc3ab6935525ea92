"""The demo's world client against real world servers: a world started on a port an earlier world
freed is another tenant, and a client told to forget the old one asks again."""

from __future__ import annotations

from pathlib import Path

from runlog.processors.demo.client import WorldClient
from runlog.processors.demo.world import serve


def test_a_world_on_a_freed_port_is_asked_for_its_own_account(tmp_path: Path) -> None:
    first = serve(tmp_path / "first")
    port = first.server_address[1]
    url = f"http://127.0.0.1:{port}"
    client = WorldClient(url)
    try:
        old = client.account()
    finally:
        first.shutdown()
        first.server_close()
    second = serve(tmp_path / "second", port)  # the freed port, as an ephemeral one may be again
    try:
        fresh = WorldClient(url).account()
        assert fresh != old  # each world is its own tenant
        assert client.account() == old  # cached: the client cannot know the world changed ...
        client.forget(url)
        assert client.account() == fresh  # ... until it is told to forget it
    finally:
        second.shutdown()
        second.server_close()
