"""One contract for every ArtifactStore adapter: subclass it once per backend.

A subclass provides ``store``, :meth:`tamper` (other bytes under a ref's name) and
:meth:`lose` (the bytes are gone).
"""

from __future__ import annotations

import asyncio
import hashlib

import pytest

from runlog.producers.calls._artifacts import ArtifactStore, inline_ref, is_inline
from runlog.schemas import ArtifactRef
from runlog.schemas.errors import ArtifactCorrupt, ArtifactError, ArtifactMissing


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

    def test_small_bytes_inline_in_their_ref_and_read_back_verified(self) -> None:
        assert self.store.inline(b"{}") is None  # inline_max 0: nothing inline
        self.store.inline_max = 16
        try:
            ref = self.store.inline(b'{"n": 1}', "application/json")
            assert ref is not None and is_inline(ref) and ref.uri.startswith("data:application/json;base64,")
            assert (ref.sha256, ref.size) == (hashlib.sha256(b'{"n": 1}').hexdigest(), 8)
            assert self.store.get(ref) == b'{"n": 1}' and self.store.exists(ref)
            self.store.verify(ref)
            assert asyncio.run(self.store.aget(ref)) == b'{"n": 1}'
            assert self.store.inline(b"x" * 16) is not None and self.store.inline(b"x" * 17) is None
            assert self.store.inline(b"") == inline_ref(b"")
        finally:
            self.store.inline_max = 0

    def test_an_inline_ref_whose_bytes_hash_otherwise_is_corrupt_and_named_without_them(self) -> None:
        carried = inline_ref(b"secret prompt text", "text/plain")
        forged = ArtifactRef(carried.uri, hashlib.sha256(b"other").hexdigest(), carried.size, "text/plain")
        for read in (self.store.get, self.store.verify):
            with pytest.raises(ArtifactCorrupt, match="hash") as err:
                read(forged)
            assert carried.uri not in str(err.value) and forged.sha256 in str(err.value)

    @pytest.mark.parametrize("uri", ["data:text/plain,hello", "data:text/plain;base64,!!not base64!!",
                                     "data:text/plain;base64"])
    def test_a_malformed_data_uri_is_corrupt(self, uri: str) -> None:
        ref = ArtifactRef(uri, hashlib.sha256(b"hello").hexdigest(), 5, "text/plain")
        with pytest.raises(ArtifactCorrupt):
            self.store.get(ref)
