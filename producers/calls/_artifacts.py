"""Content-addressed artifact store: an interface, the local-filesystem adapter and the in-memory one.

Artifacts are named by the sha256 of their bytes. ``LocalArtifactStore`` writes a
temporary file in the target directory, fsyncs it, renames it over the final name
(``os.replace``) and fsyncs the directory: a crash leaves either the whole
artifact under its final name or nothing there (at most a ``.tmp-*`` file).

Small payloads (a call's arguments and results of up to the store's ``inline_max`` bytes; the
runners and the resumer build their store with ``RUNLOG_ARTIFACT_INLINE_BYTES``, 512 by default) need no
store at all: :meth:`ArtifactStore.inline` gives a ref whose
URI is an RFC 2397 ``data:`` URI holding the bytes, so the event that carries the ref carries the
payload, made durable by the same broker acknowledgement, with no file written and no fsync. Its
``sha256`` and ``size`` are those of the bytes, verified on every read like any other artifact.
"""

from __future__ import annotations

import abc
import asyncio
import base64
import binascii
import contextlib
import hashlib
import os
import tempfile
import threading
from pathlib import Path
from urllib.parse import unquote, urlsplit

from runlog.schemas import ArtifactRef
from runlog.schemas.errors import ArtifactCorrupt, ArtifactError, ArtifactMissing

__all__ = [
    "ArtifactStore",
    "InMemoryArtifactStore",
    "LocalArtifactStore",
    "inline_bytes",
    "inline_ref",
    "is_inline",
    "label",
]

_DATA = "data:"


def inline_ref(data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
    """A ref carrying ``data`` itself, as a ``data:<media type>;base64,<bytes>`` URI."""
    sha = hashlib.sha256(data).hexdigest()
    return ArtifactRef(f"{_DATA}{media_type};base64,{base64.b64encode(data).decode('ascii')}", sha, len(data),
                       media_type)


def is_inline(ref: ArtifactRef) -> bool:
    """Whether ``ref`` carries its bytes (a ``data:`` URI) rather than naming them in a store."""
    return ref.uri.startswith(_DATA)


def label(ref: ArtifactRef) -> str:
    """How errors and reports name ``ref``: its URI, or for an inline ref its media type and hash (never the
    payload itself, which may be a prompt or a tool's result)."""
    return f"{_DATA}{ref.media_type};sha256={ref.sha256}" if is_inline(ref) else ref.uri


def inline_bytes(ref: ArtifactRef) -> bytes | None:
    """The bytes an inline ref carries, verified against its hash; None for a ref that names a store's bytes.

    Raises:
        ArtifactCorrupt: the URI is not a well-formed ``data:`` URI, or its bytes hash to something else.
    """
    if not is_inline(ref):
        return None
    head, comma, body = ref.uri[len(_DATA):].partition(",")
    if not comma or not head.endswith(";base64"):
        raise ArtifactCorrupt(label(ref), "not a base64 data: URI")
    try:
        data = base64.b64decode(body, validate=True)
    except (binascii.Error, ValueError):
        raise ArtifactCorrupt(label(ref), "the data: URI's base64 does not decode") from None
    actual = hashlib.sha256(data).hexdigest()
    if actual != ref.sha256:
        raise ArtifactCorrupt(label(ref), f"bytes hash to {actual}, expected {ref.sha256}")
    return data


class ArtifactStore(abc.ABC):
    """Where payloads live; events carry only :class:`~runlog.schemas.ArtifactRef` s.

    An S3-compatible store implements the same three methods. A store whose :attr:`inline_max` is above 0
    hands out inline refs (:meth:`inline`); its ``get`` and ``exists`` answer them with
    :func:`inline_bytes` before looking anything up, as both stores here do.
    """

    inline_max: int = 0
    """Largest payload :meth:`inline` puts in a ref instead of the store (0: none)."""
    subject: str | None = None
    """The subject whose key seals what this store writes (None: payloads are not encrypted)."""

    def for_subject(self, subject: str | None) -> ArtifactStore:
        """The store a run of ``subject`` writes through: this one, unless payloads are encrypted per
        subject (:class:`~runlog.producers.calls._sealed.SealedArtifactStore`)."""
        return self

    def open_text(self, text: str) -> str:
        """A free-text event field (an error message, an operator's reason) as a person reads it: as it is
        here; opened with the keyring where payloads are encrypted (``[erased]`` for an erased subject)."""
        return text

    def digest(self, data: bytes) -> str:
        """The content hash written beside a payload (a call's request hash, a run's parameters hash):
        sha256 here, keyed by the subject's hash key where payloads are encrypted."""
        return hashlib.sha256(data).hexdigest()

    def content_id(self, data: bytes) -> str:
        """The ``sha256`` the ref of ``data`` stored here gets (:meth:`put`), without storing it."""
        return hashlib.sha256(data).hexdigest()

    def inline(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef | None:
        """A ref carrying ``data`` itself when it is small enough (no I/O), else None: :meth:`put` it."""
        return inline_ref(data, media_type) if len(data) <= self.inline_max else None

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
        """:meth:`get` for the AsyncRunner, on a worker thread (an inline ref's bytes at once)."""
        if is_inline(ref):
            return self.get(ref)
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
    """Files under ``<root>/sha256/<hex[0:2]>/<hex[2:4]>/<hex>``, URIs ``file://<abs path>``; payloads of up
    to ``inline_max`` bytes inline in their ref (:meth:`ArtifactStore.inline`)."""

    def __init__(self, root: str | os.PathLike[str], *, inline_max: int = 0) -> None:
        self.root = Path(root).resolve()
        self.inline_max = inline_max

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
        carried = inline_bytes(ref)
        if carried is not None:
            return carried
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
        return is_inline(ref) or self._locate(ref).is_file()


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


def _check_digest(sha256: str) -> None:
    if len(sha256) != 64 or any(c not in "0123456789abcdef" for c in sha256):
        raise ArtifactError(sha256, "not a lowercase sha256 hex digest")


class InMemoryArtifactStore(ArtifactStore):
    """Bytes in a dict by sha256, URIs ``mem://sha256/<hex>``; the content hash decides, not the URI. Payloads
    of up to ``inline_max`` bytes inline in their ref, as in the local store."""

    def __init__(self, *, inline_max: int = 0) -> None:
        self._blobs: dict[str, bytes] = {}
        self._lock = threading.Lock()
        self.inline_max = inline_max

    @staticmethod
    def uri_for(sha256: str) -> str:
        return f"mem://sha256/{sha256}"

    def put(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        sha = hashlib.sha256(data).hexdigest()
        with self._lock:
            self._blobs[sha] = bytes(data)  # also repairs a corrupted entry
        return ArtifactRef(self.uri_for(sha), sha, len(data), media_type)

    async def aput(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        return self.put(data, media_type)  # no I/O: no thread hop

    async def aget(self, ref: ArtifactRef) -> bytes:
        return self.get(ref)

    def get(self, ref: ArtifactRef) -> bytes:
        carried = inline_bytes(ref)
        if carried is not None:
            return carried
        _check_digest(ref.sha256)
        with self._lock:
            data = self._blobs.get(ref.sha256)
        if data is None:
            raise ArtifactMissing(ref.uri, "no artifact stored under this name")
        actual = hashlib.sha256(data).hexdigest()
        if actual != ref.sha256:
            raise ArtifactCorrupt(ref.uri, f"bytes hash to {actual}, expected {ref.sha256}")
        return data

    def exists(self, ref: ArtifactRef) -> bool:
        if is_inline(ref):
            return True
        _check_digest(ref.sha256)
        with self._lock:
            return ref.sha256 in self._blobs

    # -- test hooks

    def corrupt(self, ref: ArtifactRef, data: bytes) -> None:
        """Store other bytes under ``ref``'s hash (a tampered or bit-rotted artifact)."""
        with self._lock:
            self._blobs[ref.sha256] = bytes(data)

    def delete(self, ref: ArtifactRef) -> None:
        """Lose the artifact."""
        with self._lock:
            self._blobs.pop(ref.sha256, None)
