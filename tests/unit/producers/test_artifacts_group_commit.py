"""The local store's group commit: puts waiting while the committer writes are written together
(two ``syncfs`` for the group), each put returns only once its artifact is durable, the same bytes
put twice in a group are written once, and a failed sync fails every put of its group and leaves
no temporary file behind."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path
from typing import Any

import pytest

from producers.calls import _artifacts
from producers.calls._artifacts import LocalArtifactStore
from schemas.errors import ArtifactError

pytestmark = pytest.mark.skipif(_artifacts._syncfs is None, reason="syncfs(2) is Linux's")


class Gated:
    """Holds the committer inside the first put it writes alone until :attr:`go` is set, so the
    puts submitted meanwhile wait together for the next group; counts the syncs."""

    def __init__(self, store: LocalArtifactStore, monkeypatch: pytest.MonkeyPatch,
                 fail_sync: bool = False) -> None:
        self.entered, self.go = threading.Event(), threading.Event()
        self.syncs = 0
        one, real_sync = store._write_one, _artifacts._syncfs
        assert real_sync is not None

        def write_one(data: bytes, final: Path) -> None:
            self.entered.set()
            assert self.go.wait(10)
            one(data, final)

        def syncfs(path: Path) -> None:
            self.syncs += 1
            if fail_sync:
                raise OSError(5, "syncfs: Input/output error")
            real_sync(path)

        monkeypatch.setattr(store, "_write_one", write_one)
        monkeypatch.setattr(_artifacts, "_syncfs", syncfs)


def test_puts_waiting_together_are_written_as_one_group_with_two_syncs(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalArtifactStore(tmp_path)
    gate = Gated(store, monkeypatch)
    first = store._submit(*_sha_and(b"first"))
    assert gate.entered.wait(10)
    blobs = [f"payload {i}".encode() for i in range(20)] + [b"payload 3"]  # one put twice
    futures = [store._submit(*_sha_and(b)) for b in blobs]
    assert not any(f.done() for f in futures)  # nothing returns before its group is durable
    gate.go.set()
    first.result(10)
    for f in futures:
        f.result(10)
    assert gate.syncs == 2  # the 20 distinct artifacts: one sync before the renames, one after
    for b in [b"first", *blobs]:
        ref = store.put(b)  # exists: nothing written again
        assert store.get(ref) == b
    assert not list(tmp_path.rglob(".tmp-*"))
    store.close()


def test_a_failed_sync_fails_every_put_of_its_group_and_leaves_no_temporary_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = LocalArtifactStore(tmp_path)
    gate = Gated(store, monkeypatch, fail_sync=True)
    first = store._submit(*_sha_and(b"first"))
    assert gate.entered.wait(10)
    futures = [store._submit(*_sha_and(f"p{i}".encode())) for i in range(5)]
    gate.go.set()
    first.result(10)  # written alone: fsynced, not synced
    for f in futures:
        with pytest.raises(ArtifactError, match="syncfs"):
            f.result(10)
    assert not list(tmp_path.rglob(".tmp-*"))
    assert not [p for p in tmp_path.rglob("*") if p.is_file() and p.read_bytes().startswith(b"p")]
    store.close()


def test_aput_from_many_runs_on_one_loop_returns_each_ref(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)

    async def go() -> list[Any]:
        puts = (store.aput(f"run {i}".encode(), "application/json") for i in range(200))
        return await asyncio.gather(*puts)

    refs = asyncio.run(go())
    assert [store.get(r) for r in refs] == [f"run {i}".encode() for i in range(200)]
    assert {r.media_type for r in refs} == {"application/json"}
    assert all(r.uri == store.path_for(r.sha256).as_uri() for r in refs)
    store.close()


def _sha_and(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data
