"""The namespace marker on its own, against a dict-backed client: the generation a store writes under
is the marker's (created when the namespace has none), and no generation is handed out mid-rebuild."""

from __future__ import annotations

from typing import Any

import pytest

from runlog.projections._marker import READY, REBUILDING, REPLAYING
from runlog.projections._marker_store import NamespaceMarker
from runlog.projections._sharded import ProjectionLost


class _Pipe:
    def __init__(self, client: _Redis) -> None:
        self.client, self.ops = client, []

    def hsetnx(self, key: str, field: str, value: str) -> None:
        self.ops.append((key, field, value))

    def execute(self) -> list[int]:
        out = []
        for key, field, value in self.ops:
            h = self.client.hashes.setdefault(key, {})
            out.append(int(field.encode() not in h))
            h.setdefault(field.encode(), value.encode())
        return out


class _Redis:
    def __init__(self) -> None:
        self.hashes: dict[str, dict[bytes, bytes]] = {}

    def register_script(self, source: str) -> Any:
        return None  # the scripted moves run on a real Redis (tests/integration/projections)

    def pipeline(self, transaction: bool = True) -> _Pipe:
        return _Pipe(self)

    def hgetall(self, key: str) -> dict[bytes, bytes]:
        return dict(self.hashes.get(key, {}))


def _marker() -> tuple[NamespaceMarker, _Redis]:
    client = _Redis()
    return NamespaceMarker(client, "p"), client  # type: ignore[arg-type]


def test_a_new_namespace_gets_a_marker_whose_generation_the_store_adopts() -> None:
    ns, client = _marker()
    assert ns.held is None and ns.marker() is None
    gen = ns.generation
    assert client.hashes["p:projection"] == {b"gen": gen.encode(), b"state": READY.encode()}
    assert ns.held == gen and ns.generation == gen


def test_an_existing_marker_is_adopted_not_replaced() -> None:
    ns, client = _marker()
    client.hashes["p:projection"] = {b"gen": b"g0", b"state": REPLAYING.encode()}
    assert ns.generation == "g0"  # a replaying namespace is written to
    ns.adopt(None)
    assert ns.held is None and ns.generation == "g0"  # looked up again


def test_no_generation_is_handed_out_while_the_namespace_is_rebuilt() -> None:
    ns, client = _marker()
    client.hashes["p:projection"] = {b"gen": b"g9", b"state": REBUILDING.encode()}
    with pytest.raises(ProjectionLost, match="being rebuilt"):
        ns.generation  # noqa: B018
    assert ns.held is None
