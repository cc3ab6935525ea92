"""Content-addressed artifact store: an interface and the local-filesystem adapter.

Artifacts are named by the sha256 of their bytes. ``LocalArtifactStore`` writes a
temporary file in the target directory, fsyncs it, renames it over the final name
(``os.replace``) and fsyncs the directory: a crash leaves either the whole
artifact under its final name or nothing there (at most a ``.tmp-*`` file).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import hashlib
import os
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlsplit

from schemas._types import ArtifactRef
from schemas.errors import ArtifactCorrupt, ArtifactError, ArtifactMissing

__all__ = ["ArtifactStore", "LocalArtifactStore"]


class ArtifactStore(abc.ABC):
    """Where payloads live; events carry only :class:`~schemas.ArtifactRef` s.

    An S3-compatible store implements the same three methods.
    """

    @abc.abstractmethod
    def put(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        """Store ``data`` (idempotent: the same bytes give the same ref)."""

    @abc.abstractmethod
    def get(self, ref: ArtifactRef) -> bytes:
        """The stored bytes, verified against ``ref.sha256``.

        Raises:
            ArtifactMissing: nothing is stored under that hash.
            ArtifactCorrupt: the stored bytes hash to something else.
        """

    @abc.abstractmethod
    def exists(self, ref: ArtifactRef) -> bool:
        """Whether bytes are stored under ``ref.sha256`` (does not verify them)."""

    def verify(self, ref: ArtifactRef) -> None:
        """Raise ArtifactMissing / ArtifactCorrupt unless the artifact is intact."""
        self.get(ref)

    async def aput(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        """:meth:`put` for the AsyncRunner: on a worker thread (a durable put fsyncs), not on the loop."""
        return await asyncio.to_thread(self.put, data, media_type)

    async def aget(self, ref: ArtifactRef) -> bytes:
        """:meth:`get` for the AsyncRunner, on a worker thread."""
        return await asyncio.to_thread(self.get, ref)


def _private_dirs(root: Path, leaf: Path) -> None:
    """Make ``leaf`` (under ``root``) and the directories between them readable by their owner only:
    payloads hold prompts, model answers and tool results."""
    if not root.exists():
        root.mkdir(parents=True, exist_ok=True, mode=0o700)
    todo = []
    p = leaf
    while p != root and not p.exists():
        todo.append(p)
        p = p.parent
    for d in reversed(todo):
        with contextlib.suppress(FileExistsError):
            d.mkdir(mode=0o700)


class LocalArtifactStore(ArtifactStore):
    """Files under ``<root>/sha256/<hex[0:2]>/<hex[2:4]>/<hex>``, URIs ``file://<abs path>``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root).resolve()

    def path_for(self, sha256: str) -> Path:
        if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
            raise ArtifactError(sha256, "not a lowercase sha256 hex digest")
        return self.root / "sha256" / sha256[0:2] / sha256[2:4] / sha256

    def _ref(self, sha: str, size: int, media_type: str) -> ArtifactRef:
        return ArtifactRef(self.path_for(sha).as_uri(), sha, size, media_type)

    def put(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        final = self.path_for(sha)
        if final.exists() and _hash_file(final) == sha:
            return self._ref(sha, len(data), media_type)
        _private_dirs(self.root, final.parent)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=final.parent)  # mode 0600: the owner's only
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        except OSError as err:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise ArtifactError(final.as_uri(), f"write failed: {err}") from err
        _fsync_dir(final.parent)
        return self._ref(sha, len(data), media_type)

    def _locate(self, ref: ArtifactRef) -> Path:
        path = self.path_for(ref.sha256)
        parts = urlsplit(ref.uri)
        if parts.scheme == "file" and Path(unquote(parts.path)) != path:
            # A ref written by a store with another root: the content hash decides.
            other = Path(unquote(parts.path))
            if not path.exists() and other.exists():
                return other
        return path

    def get(self, ref: ArtifactRef) -> bytes:
        path = self._locate(ref)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ArtifactMissing(ref.uri, "no artifact stored under this name") from None
        except OSError as err:
            raise ArtifactError(ref.uri, f"read failed: {err}") from err
        actual = hashlib.sha256(data).hexdigest()
        if actual != ref.sha256:
            raise ArtifactCorrupt(ref.uri, f"bytes hash to {actual}, expected {ref.sha256}")
        return data

    def exists(self, ref: ArtifactRef) -> bool:
        return self._locate(ref).is_file()


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
