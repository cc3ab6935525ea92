"""One contract for every ArtifactStore adapter: subclass it once per backend.

A subclass provides ``store``, :meth:`tamper` (other bytes under a ref's name) and
:meth:`lose` (the bytes are gone).
"""

from __future__ import annotations

import hashlib

import pytest

from producers.calls._artifacts import ArtifactStore
from schemas import ArtifactRef
from schemas.errors import ArtifactCorrupt, ArtifactError, ArtifactMissing


class ArtifactContract:
    store: ArtifactStore

    def tamper(self, ref: ArtifactRef, data: bytes) -> None:
        raise NotImplementedError

    def lose(self, ref: ArtifactRef) -> None:
        raise NotImplementedError

    def test_put_get_is_content_addressed_and_idempotent(self) -> None:
        ref = self.store.put(b"hello", "text/plain")
        sha = hashlib.sha256(b"hello").hexdigest()
        assert (ref.sha256, ref.size, ref.media_type) == (sha, 5, "text/plain")
        assert ref.uri
        assert self.store.get(ref) == b"hello" and self.store.exists(ref)
        self.store.verify(ref)
        assert self.store.put(b"hello", "text/plain") == ref
        other = self.store.put(b"world")
        assert other.sha256 != ref.sha256 and other.media_type == "application/octet-stream"
        assert self.store.get(other) == b"world" and self.store.get(ref) == b"hello"

    def test_empty_bytes_are_an_artifact(self) -> None:
        ref = self.store.put(b"")
        assert ref.size == 0 and self.store.get(ref) == b""

    def test_the_hash_decides_not_the_uri(self) -> None:
        ref = self.store.put(b"moved")
        elsewhere = ArtifactRef("s3://elsewhere/x", ref.sha256, ref.size, ref.media_type)
        assert self.store.exists(elsewhere) and self.store.get(elsewhere) == b"moved"

    def test_an_unknown_hash_is_missing(self) -> None:
        sha = hashlib.sha256(b"never stored").hexdigest()
        ref = ArtifactRef("s3://elsewhere/y", sha, 12, "text/plain")
        assert not self.store.exists(ref)
        with pytest.raises(ArtifactMissing):
            self.store.get(ref)
        with pytest.raises(ArtifactMissing):
            self.store.verify(ref)

    def test_a_lost_artifact_is_missing(self) -> None:
        ref = self.store.put(b"x")
        self.lose(ref)
        assert not self.store.exists(ref)
        with pytest.raises(ArtifactMissing):
            self.store.get(ref)

    def test_tampered_bytes_are_corrupt_and_put_repairs_them(self) -> None:
        ref = self.store.put(b"cover image bytes")
        self.tamper(ref, b"cover image bytez")
        assert self.store.exists(ref)  # exists does not verify
        with pytest.raises(ArtifactCorrupt, match="hash"):
            self.store.get(ref)
        with pytest.raises(ArtifactCorrupt):
            self.store.verify(ref)
        assert self.store.put(b"cover image bytes") == ref
        assert self.store.get(ref) == b"cover image bytes"

    def test_a_malformed_digest_is_refused(self) -> None:
        with pytest.raises(ArtifactError):
            self.store.get(ArtifactRef("x://y", "NOT-A-DIGEST", 0, "text/plain"))
