"""The local and the in-memory artifact stores pass the shared contract (no services needed)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runlog.producers.calls._artifacts import LocalArtifactStore
from runlog.schemas import ArtifactRef
from runlog.testing import InMemoryArtifactStore

from .artifact_contract import ArtifactContract


class TestLocalArtifactStore(ArtifactContract):
    @pytest.fixture(autouse=True)
    def _store(self, tmp_path: Path) -> None:
        self.local = self.store = LocalArtifactStore(tmp_path)

    def tamper(self, ref: ArtifactRef, data: bytes) -> None:
        self.local.path_for(ref.sha256).write_bytes(data)

    def lose(self, ref: ArtifactRef) -> None:
        os.unlink(self.local.path_for(ref.sha256))


class TestInMemoryArtifactStore(ArtifactContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.mem = self.store = InMemoryArtifactStore()

    def tamper(self, ref: ArtifactRef, data: bytes) -> None:
        self.mem.corrupt(ref, data)

    def lose(self, ref: ArtifactRef) -> None:
        self.mem.delete(ref)

