"""Envelope encryption of payloads at the artifact store: :class:`SealedArtifactStore` wraps any store.

Every payload that goes through a store (run parameters, call arguments and results, stage outputs,
signal data, stored artifacts; inline ``data:`` refs as well, since they are made by
:meth:`~runlog.producers.calls._artifacts.ArtifactStore.inline`) is sealed in an *envelope*::

    magic  b"\\x00RLE\\x01"      5 bytes   (never the start of JSON or UTF-8 text)
    key id                      16 bytes  (the subject's data key: runlog.producers.base._keyring.key_id_of)
    nonce                       12 bytes  HMAC-SHA256(nonce key, plaintext)[:12], a synthetic nonce
    ciphertext + GCM tag        n + 16    AES-256-GCM, associated data = magic + key id

The nonce is derived from the plaintext under the subject's key (deterministic encryption): the same
payload of the same subject gives the same envelope, so refs stay content-addressed (a put is idempotent,
a checkpoint's artifacts verify by the hash of their bytes without any key) while nobody without the data
key can compute an envelope or its hash from a guessed payload. A ref's ``sha256`` and ``size`` are those
of the envelope; its ``uri`` and ``media_type`` stay readable.

Content hashes the machinery writes beside payloads (a call's ``request_hash``, the ``params_hash``) come
from :meth:`ArtifactStore.digest`, here HMAC-SHA256 under the subject's hash key instead of a bare sha256.

Reads need no subject: the envelope names its key. Writes need one: :meth:`SealedArtifactStore.for_subject`
gives the view a run writes through (the runners bind it to the run's subject, ``RUN_STARTED``
attribute ``subject``); the unbound store writes under the default subject.
"""

from __future__ import annotations

import base64
import hashlib
import hmac

from runlog.producers.base._envelope import (
    MAGIC,
    OVERHEAD,
    TEXT_PREFIX,
    TextSealer,
    is_sealed,
    open_sealed,
    open_text,
    seal,
    seal_text,
)
from runlog.producers.base._key_source import subject_keys
from runlog.producers.base._keyring import DataKey, SubjectKeys
from runlog.producers.calls._artifacts import ArtifactStore, LocalArtifactStore, inline_ref, is_inline
from runlog.schemas import ArtifactRef, Settings
from runlog.schemas.errors import PayloadKeyError

__all__ = ["MAGIC", "OVERHEAD", "TEXT_PREFIX", "SealedArtifactStore", "is_sealed", "open_sealed", "open_text",
           "seal", "seal_text", "sealing", "store_from_settings"]


class SealedArtifactStore(ArtifactStore):
    """A store whose payloads are sealed under their subject's data key before they reach ``base``, and
    opened after they come back (verified by ``base`` against the envelope's hash, then by GCM).

    Args:
        base: the store the envelopes live in (local, in memory, S3-compatible...).
        keys: the subjects' data keys.
        subject: the subject writes are sealed for (the default subject on the unbound store).
    """

    subject: str

    def __init__(self, base: ArtifactStore, keys: SubjectKeys, subject: str) -> None:
        self.base = base
        self.keys = keys
        self.subject = subject
        self.inline_max = base.inline_max

    def for_subject(self, subject: str | None) -> ArtifactStore:
        if subject is None or subject == self.subject:
            return self
        return SealedArtifactStore(self.base, self.keys, subject)

    def open_text(self, text: str) -> str:
        return TextSealer(self.keys, self.subject).open(text)

    def _key(self) -> DataKey:
        return self.keys.for_subject(self.subject)

    def digest(self, data: bytes) -> str:
        return hmac.digest(self._key().hash_key, data, "sha256").hex()

    def content_id(self, data: bytes) -> str:
        return hashlib.sha256(seal(self._key(), data)).hexdigest()

    def inline(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef | None:
        if len(data) + OVERHEAD > self.inline_max:
            return None
        return inline_ref(seal(self.keys.for_subject(self.subject), data), media_type)  # per event: no _key()

    def put(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        return self.base.put(seal(self._key(), data), media_type)

    async def aput(self, data: bytes, media_type: str = "application/octet-stream") -> ArtifactRef:
        return await self.base.aput(seal(self._key(), data), media_type)

    def _open(self, raw: bytes) -> bytes:
        return open_sealed(self.keys, raw) if is_sealed(raw) else raw  # payloads written before encryption

    def get(self, ref: ArtifactRef) -> bytes:
        return self._open(self.base.get(ref))

    async def aget(self, ref: ArtifactRef) -> bytes:
        return self._open(await self.base.aget(ref))

    def exists(self, ref: ArtifactRef) -> bool:
        return self.base.exists(ref)

    def verify(self, ref: ArtifactRef) -> None:
        self.base.verify(ref)  # the envelope's hash: no key needed (an erased subject's artifacts verify)

    def opens(self, ref: ArtifactRef) -> bool:
        """Whether the payload is readable here (False for an erased or unknown key)."""
        try:
            self.get(ref)
        except PayloadKeyError:
            return False
        return True

    @staticmethod
    def sealed_ref(ref: ArtifactRef) -> bool:
        """Whether an inline ref carries an envelope (a stored one's bytes must be read to tell)."""
        if not is_inline(ref):
            return False
        body = ref.uri.partition(",")[2]
        return base64.b64decode(body[:8] + "=" * (-len(body[:8]) % 4))[:len(MAGIC)] == MAGIC


def sealing(base: ArtifactStore, settings: Settings) -> ArtifactStore:
    """``base``, sealed under the keyring of ``settings`` when ``RUNLOG_ENCRYPTION`` is on (a store that
    is sealed already is returned as it is)."""
    if not settings.encryption or isinstance(base, SealedArtifactStore):
        return base
    return SealedArtifactStore(base, subject_keys(settings), settings.default_subject)


def store_from_settings(settings: Settings, *, inline: bool = True) -> ArtifactStore:
    """The local artifact store of ``settings`` (inline refs up to ``RUNLOG_ARTIFACT_INLINE_BYTES`` unless
    ``inline`` is False), sealed when ``RUNLOG_ENCRYPTION`` is on."""
    base = LocalArtifactStore(settings.artifact_root,
                              inline_max=settings.inline_payload_bytes if inline else 0)
    return sealing(base, settings)
