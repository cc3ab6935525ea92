"""The local artifact store and the input sources (filesystem only, no services)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runlog.producers import DictInputSource, InputNotFound, JsonDirInputSource, LocalArtifactStore
from runlog.producers.calls._keys import sha256_hex
from runlog.producers.define._inputs import PinnedInputs
from runlog.schemas import ArtifactRef
from runlog.schemas.errors import ArtifactCorrupt, ArtifactMissing

ROOT = Path(__file__).resolve().parents[3]


def test_put_get_is_content_addressed(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    ref = store.put(b"hello", "text/plain")
    sha = sha256_hex(b"hello")
    assert ref == ArtifactRef((tmp_path / "sha256" / sha[:2] / sha[2:4] / sha).as_uri(), sha, 5, "text/plain")
    assert store.get(ref) == b"hello" and store.exists(ref)
    assert store.put(b"hello", "text/plain") == ref
    assert [p.name for p in (tmp_path / "sha256" / sha[:2] / sha[2:4]).iterdir()] == [sha]


def test_tampered_artifact_is_detected(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    ref = store.put(b"cover image bytes")
    Path(store.path_for(ref.sha256)).write_bytes(b"cover image bytez")
    with pytest.raises(ArtifactCorrupt, match="hash"):
        store.get(ref)
    fixed = store.put(b"cover image bytes")  # put repairs a corrupt file
    assert store.get(fixed) == b"cover image bytes"


def test_missing_artifact(tmp_path: Path) -> None:
    store = LocalArtifactStore(tmp_path)
    ref = store.put(b"x")
    os.unlink(store.path_for(ref.sha256))
    assert not store.exists(ref)
    with pytest.raises(ArtifactMissing):
        store.get(ref)


_CHILD = textwrap.dedent("""
    import os, sys, time
    sys.path.insert(0, sys.argv[1])
    from runlog.producers import LocalArtifactStore
    real_fsync = os.fsync
    def slow_fsync(fd):
        real_fsync(fd)
        print("writing", flush=True)
        time.sleep(60)
    os.fsync = slow_fsync
    LocalArtifactStore(sys.argv[2]).put(b"x" * (4 << 20))
""")


def test_crash_during_put_leaves_no_artifact_under_its_final_name(tmp_path: Path) -> None:
    payload_sha = sha256_hex(b"x" * (4 << 20))
    store = LocalArtifactStore(tmp_path)
    with subprocess.Popen([sys.executable, "-c", _CHILD, str(ROOT), str(tmp_path)],
                          stdout=subprocess.PIPE, text=True) as child:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "writing"  # bytes written + fsynced, not renamed
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    final = store.path_for(payload_sha)
    assert not final.exists()
    leftovers = list(final.parent.iterdir())
    assert leftovers and all(p.name.startswith(".tmp-") for p in leftovers)  # the killed write was real
    ref = ArtifactRef(final.as_uri(), payload_sha, 4 << 20)
    with pytest.raises(ArtifactMissing):
        store.get(ref)


def test_dict_source_and_pinning() -> None:
    src = DictInputSource({"facts": {"v1": [1], "v2": [1, 2]}, "style": {"a": "terse"}})
    pinned = PinnedInputs.pin(src, ["facts", "style"], {"facts": "v1"})
    assert pinned.versions == {"facts": "v1", "style": "a"}
    assert pinned.load(["facts"]) == {"facts": [1]}
    with pytest.raises(InputNotFound, match="not pinned"):
        pinned.get("other")
    with pytest.raises(InputNotFound):
        PinnedInputs.pin(src, ["facts"], {"facts": "v9"})
    with pytest.raises(InputNotFound):
        PinnedInputs.pin(src, ["missing"])


def test_pinned_version_survives_a_newer_latest(tmp_path: Path) -> None:
    (tmp_path / "facts").mkdir()
    (tmp_path / "facts" / "2024-01.json").write_text(json.dumps({"n": 1}))
    src = JsonDirInputSource(tmp_path)
    pinned = PinnedInputs.pin(src, ["facts"])
    assert pinned.versions == {"facts": "2024-01"}
    time.sleep(0.01)
    (tmp_path / "facts" / "2024-02.json").write_text(json.dumps({"n": 2}))
    assert src.latest("facts") == "2024-02"
    assert pinned.get("facts") == {"n": 1}
    (tmp_path / "facts" / "LATEST").write_text("2024-01\n")
    assert src.latest("facts") == "2024-01"
    with pytest.raises(InputNotFound):
        src.get("facts", "1999")


def test_the_local_artifact_store_keeps_payloads_readable_by_their_owner_only(tmp_path: Path) -> None:
    import stat

    store = LocalArtifactStore(tmp_path / "artifacts")
    ref = store.put(b'{"prompt": "secret"}', "application/json")
    path = store.path_for(ref.sha256)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    d = path.parent
    while True:
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d
        if d == store.root:
            break
        d = d.parent
