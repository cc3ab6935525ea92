"""The payload envelope (AES-256-GCM under a subject's data key) and the sealing of free-text event fields.

An envelope is::

    magic  b"\\x00RLE\\x01"      5 bytes   (never the start of JSON or UTF-8 text)
    key id                      16 bytes  (the subject's data key: runlog.producers.base._keyring.key_id_of)
    nonce                       12 bytes  keyed BLAKE2b(nonce key, plaintext), 12 bytes: a synthetic nonce
    ciphertext + GCM tag        n + 16    AES-256-GCM, associated data = magic + key id

A sealed *string* field is ``rlenc1:`` followed by the envelope of its UTF-8 bytes in base64.

:class:`TextSealer` seals the free text an event carries that may hold personal data, at the run session
(:mod:`runlog.producers.log._session`), under the run's subject's key:

- ``error.message`` of every event (a failing tool's exception text, a verification's details, an
  operator's cancel reason), except the machine-made messages of :data:`READABLE_ERROR_KINDS`, which
  the machinery parses (an effect in doubt names its delivery key and run);
- the ``detail`` of each verification rule's result (a rule's failure may quote the output it checked);
- the attributes named in :data:`SEALED_ATTRIBUTES` (an operator's ``reason`` / ``why``).

Readers open them with :meth:`TextSealer.open` (``[erased]`` for an erased subject, the sealed text as it
is without the key); a text of an erased subject cannot be sealed and is written as ``[erased]``.
"""

from __future__ import annotations

import base64
import dataclasses
from collections.abc import Mapping
from hashlib import blake2b
from typing import Any

from cryptography.exceptions import InvalidTag

from runlog.producers.base._key_source import subject_keys
from runlog.producers.base._keyring import DataKey, SubjectKeys
from runlog.schemas.errors import PayloadKeyError, SubjectErased
from runlog.schemas.settings import Settings

__all__ = ["ERASED_TEXT", "MAGIC", "OVERHEAD", "READABLE_ERROR_KINDS", "SEALED_ATTRIBUTES", "TEXT_PREFIX",
           "TextSealer", "is_sealed", "open_sealed", "open_text", "seal", "seal_text", "text_sealer"]

MAGIC = b"\x00RLE\x01"
_HEAD = len(MAGIC) + 16
OVERHEAD = _HEAD + 12 + 16
"""Bytes an envelope adds to its payload."""
TEXT_PREFIX = "rlenc1:"
"""How a sealed string field starts: then base64 of the envelope."""
ERASED_TEXT = "[erased]"
"""What a sealed text of an erased subject reads as (and is written as, once its key is gone)."""
SEALED_ATTRIBUTES = frozenset({"reason", "why"})
"""Event attributes whose values are sealed: an operator's free-text reasons."""
READABLE_ERROR_KINDS = frozenset({"EffectInDoubt", "SubjectErased"})
"""Error kinds whose messages stay readable: made by Runlog from metadata (delivery keys, run ids)."""


def is_sealed(data: bytes) -> bool:
    return data[:len(MAGIC)] == MAGIC


def seal(key: DataKey, data: bytes) -> bytes:
    """``data``'s envelope under ``key`` (see the module docstring)."""
    head = key.head or MAGIC + bytes.fromhex(key.key_id)
    # keyed BLAKE2b, a PRF like HMAC-SHA256 at an eighth of its cost on a small payload; a reader takes
    # the nonce from the envelope (envelopes written with the HMAC-SHA256 nonce open the same way)
    base = key.nonce_base
    if base is None:
        nonce = blake2b(data, key=key.nonce_key, digest_size=12).digest()
    else:  # the keyed state made once (DataKey.nonce_base): the same digest
        h = base.copy()
        h.update(data)
        nonce = h.digest()
    return b"".join((head, nonce, key.aead.encrypt(nonce, data, head)))


def open_sealed(keys: SubjectKeys, envelope: bytes) -> bytes:
    """The payload an envelope holds.

    Raises:
        SubjectErased: its subject was erased.
        PayloadKeyError: its key is not in this keyring, or the envelope does not authenticate.
    """
    if len(envelope) < OVERHEAD or not is_sealed(envelope):
        raise PayloadKeyError("?", "not a Runlog envelope")
    head = envelope[:_HEAD]
    key_id = head[len(MAGIC):].hex()
    key = keys.by_id(key_id)
    try:
        return key.aead.decrypt(envelope[_HEAD:_HEAD + 12], envelope[_HEAD + 12:], head)
    except InvalidTag:
        raise PayloadKeyError(key_id, "the envelope does not authenticate under its data key") from None


def seal_text(key: DataKey, text: str) -> str:
    """A string field sealed: ``rlenc1:`` + base64 of the envelope of its UTF-8 bytes."""
    return TEXT_PREFIX + base64.b64encode(seal(key, text.encode("utf-8"))).decode("ascii")


def open_text(keys: SubjectKeys, text: str) -> str:
    """A string field opened (one that is not sealed comes back as it is)."""
    if not text.startswith(TEXT_PREFIX):
        return text
    return open_sealed(keys, base64.b64decode(text[len(TEXT_PREFIX):])).decode("utf-8")


class TextSealer:
    """Seals and opens the free-text fields of events under a subject's data key.

    Args:
        keys: the subjects' data keys.
        default_subject: the subject of a run started without one.
    """

    def __init__(self, keys: SubjectKeys, default_subject: str) -> None:
        self.keys = keys
        self.default_subject = default_subject

    def seal(self, subject: str | None, text: str) -> str:
        """``text`` sealed for ``subject`` (empty and already sealed texts as they are; ``[erased]`` for an
        erased subject: its text must not be written in clear)."""
        if not text or text.startswith(TEXT_PREFIX) or text == ERASED_TEXT:
            return text
        try:
            key = self.keys.for_subject(subject or self.default_subject)
        except SubjectErased:
            return ERASED_TEXT
        return seal_text(key, text)

    def open(self, text: str) -> str:
        """``text`` opened: ``[erased]`` when its subject was erased; as it is (sealed) when its key is not
        in this keyring."""
        try:
            return open_text(self.keys, text)
        except SubjectErased:
            return ERASED_TEXT
        except PayloadKeyError:
            return text

    def seal_fields(self, subject: str | None, fields: Mapping[str, Any]) -> dict[str, Any]:
        """An event's fields (``RunEvent`` keyword arguments) with their free text sealed (see the module
        docstring); the others untouched."""
        out = dict(fields)
        err = out.get("error")
        if err is not None and err.message and err.kind not in READABLE_ERROR_KINDS:
            out["error"] = dataclasses.replace(err, message=self.seal(subject, err.message))
        rules = out.get("verification")
        if rules and any(r.detail for r in rules):  # a rule's detail may quote the output it checked
            out["verification"] = tuple(dataclasses.replace(r, detail=self.seal(subject, r.detail))
                                        if r.detail else r for r in rules)
        attrs = out.get("attributes")
        if attrs and not SEALED_ATTRIBUTES.isdisjoint(attrs):
            out["attributes"] = {k: self.seal(subject, v) if k in SEALED_ATTRIBUTES else v
                                 for k, v in attrs.items()}
        return out


def text_sealer(settings: Settings) -> TextSealer | None:
    """The text sealer of ``settings`` (its keyring and default subject); None when ``RUNLOG_ENCRYPTION``
    is off."""
    if not settings.encryption:
        return None
    return TextSealer(subject_keys(settings), settings.default_subject)
