"""The artifacts a stage stores: put as protocol steps, listed in the stage's ``VERIFIED``."""

from __future__ import annotations

import threading

from runlog.producers.base._protocol import Steps, io
from runlog.producers.calls._artifacts import ArtifactStore, is_inline
from runlog.producers.calls._calls import JSON
from runlog.schemas import ArtifactRef

__all__ = ["StageArtifacts"]


class StageArtifacts:
    """What one stage execution stored (thread-safe: a ``def`` stage's submitted calls share it)."""

    def __init__(self, store: ArtifactStore) -> None:
        self.store = store
        self._lock = threading.Lock()
        self._refs: dict[str, ArtifactRef] = {}

    def put(self, data: bytes, media_type: str = JSON, *, inline: bool = True) -> Steps[ArtifactRef]:
        """Store bytes (a step: off the loop in the async form); listed in ``VERIFIED``'s artifacts. Small
        bytes (``inline``) are carried in their ref instead, with no I/O and nothing to list: the event
        that records them holds them."""
        ref = self.store.inline(data, media_type) if inline else None
        if ref is None:
            ref = yield from io(self.store.put, self.store.aput, data, media_type)
            self.add(ref)
        return ref

    def add(self, ref: ArtifactRef) -> None:
        """List a ref this stage read or wrote (an inline one is in its event already: not listed)."""
        if is_inline(ref):
            return
        with self._lock:
            self._refs.setdefault(ref.sha256, ref)

    def has(self, sha256: str) -> bool:
        with self._lock:
            return sha256 in self._refs

    @property
    def refs(self) -> tuple[ArtifactRef, ...]:
        with self._lock:
            return tuple(self._refs.values())
