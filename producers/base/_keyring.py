"""Keys for payload encryption: a data key per subject, wrapped by a key-encryption key (KEK) of a provider.

Two interfaces, one adapter each here:

- :class:`KeyProvider` holds the key-encryption keys and wraps / unwraps data keys (``wrap``,
  ``unwrap``, ``rotate``, ``retire``). :class:`LocalKeyProvider` keeps versioned 32-byte KEKs in
  ``<keyring>/kek/v<N>.key``. A KMS adapter implements the same four methods: HashiCorp Vault's or
  OpenBao's transit engine maps them onto ``transit/encrypt/<key>``, ``transit/decrypt/<key>``,
  ``transit/keys/<key>/rotate`` and ``transit/keys/<key>/config`` (``min_decryption_version``), the
  ciphertext it returns (``vault:v<N>:...``) being the wrapped key:
  :class:`~runlog.producers.base._transit.TransitKeyProvider`.
- :class:`SubjectKeys` keeps each subject's *wrapped* data key in ``<keyring>/subjects/<key id>.json``
  and the unwrapped key in memory (a cache, checked against the file whenever the keyring's erase
  generation moved, so an erase made by another process takes effect at the next payload), creates a
  subject's key on first use, and erases one
  (:meth:`SubjectKeys.erase`: the wrapped key is deleted, a tombstone ``<keyring>/erased/<key id>.json``
  records who, why and when; a payload of that subject then raises
  :class:`~runlog.schemas.errors.SubjectErased` wherever it is read).

A subject's key id is ``sha256("runlog.subject\\0" + subject)[:16]`` (hex, 32 characters): the envelope of
every payload names it, so a reader needs no subject to open a payload. Every file is the owner's only
(0600 in 0700 directories); a file is written to a temporary name, fsynced and renamed.
"""

from __future__ import annotations

import abc
import base64
import contextlib
import fcntl
import hashlib
import hmac
import json
import mmap
import os
import secrets
import tempfile
import threading
import time
from dataclasses import dataclass
from hashlib import blake2b
from pathlib import Path
from typing import Any, TypeVar

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from runlog.schemas.errors import ConfigError, PayloadKeyError, SubjectErased

__all__ = [
    "DataKey",
    "KeyProvider",
    "LocalKeyProvider",
    "SubjectKeys",
    "WrappedKey",
    "key_id_of",
]

_KEY_BYTES = 32
_K = TypeVar("_K")
_V = TypeVar("_V")


def key_id_of(subject: str) -> str:
    """The key id (32 hex characters) under which ``subject``'s data key is kept and its payloads name it."""
    if not subject:
        raise ConfigError("a subject must be a non-empty string")
    return hashlib.sha256(b"runlog.subject\0" + subject.encode("utf-8")).hexdigest()[:32]


@dataclass(frozen=True)
class WrappedKey:
    """A data key encrypted under one version of a key-encryption key."""

    kek_version: int
    blob: bytes


class KeyProvider(abc.ABC):
    """Holds key-encryption keys; never hands one out, only wraps and unwraps data keys with it.

    ``context`` (the subject's key id) is bound to the wrapping (AES-GCM associated data locally, the
    transit engine's ``context`` for a KMS), so a wrapped key moved to another subject does not unwrap.
    """

    @abc.abstractmethod
    def wrap(self, data_key: bytes, context: str) -> WrappedKey:
        """``data_key`` encrypted under the current KEK version."""

    @abc.abstractmethod
    def unwrap(self, wrapped: WrappedKey, context: str) -> bytes:
        """The data key back.

        Raises:
            PayloadKeyError: that KEK version is retired or missing, or the blob does not authenticate.
        """

    @abc.abstractmethod
    def rotate(self) -> int:
        """Make a new KEK version current (older ones still unwrap until retired); returns it."""

    @abc.abstractmethod
    def current_version(self) -> int:
        """The KEK version :meth:`wrap` uses."""

    @abc.abstractmethod
    def retire(self, below: int) -> list[int]:
        """Destroy KEK versions below ``below`` (data keys wrapped by them no longer unwrap); the versions
        destroyed."""


def _private_dir(path: Path) -> None:
    path.mkdir(parents=True, exist_ok=True, mode=0o700)
    os.chmod(path, 0o700)


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` as 0600 (temporary file, fsync, rename, directory fsync)."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def _create_private(path: Path, data: bytes) -> bool:
    """Create ``path`` as 0600 with ``data`` unless it exists (atomic across processes: a hard link of
    a complete temporary file, which fails when the name is taken); False when another process (or
    an earlier call) made it first: its content stands."""
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=path.parent)  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
    return True


def _check_private(path: Path) -> None:
    mode = path.stat().st_mode & 0o777
    if mode & 0o077:
        raise ConfigError(f"{path} is readable by others (mode {mode:o}): a keyring file must be 0600 in a "
                          "0700 directory")


class LocalKeyProvider(KeyProvider):
    """KEKs as files ``<root>/kek/v<N>.key`` (32 random bytes each, 0600), the current version in
    ``<root>/kek/current``; the first use creates version 1. AES-256-GCM wraps the data keys."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.dir = Path(root) / "kek"
        self._lock = threading.RLock()  # rotate() asks current_version(), which may make the first KEK
        self._keks: dict[int, AESGCM] = {}

    def _path(self, version: int) -> Path:
        return self.dir / f"v{version}.key"

    def current_version(self) -> int:
        cur = self.dir / "current"
        try:
            return int(cur.read_text().strip())
        except FileNotFoundError:
            with self._lock:  # two processes making the keyring at once agree on one first KEK
                if not cur.exists():
                    _private_dir(self.dir)
                    _create_private(self._path(1), secrets.token_bytes(_KEY_BYTES))
                    _create_private(cur, b"1")
            return int(cur.read_text().strip())
        except ValueError as err:
            raise ConfigError(f"{cur}: not a KEK version number") from err

    def _kek(self, version: int) -> AESGCM:
        kek = self._keks.get(version)
        if kek is None:
            path = self._path(version)
            try:
                _check_private(path)
                raw = path.read_bytes()
            except FileNotFoundError:
                raise PayloadKeyError(f"kek-v{version}", f"key-encryption key version {version} is missing "
                                      f"or retired ({path})") from None
            if len(raw) != _KEY_BYTES:
                raise ConfigError(f"{path}: a key-encryption key is {_KEY_BYTES} bytes, found {len(raw)}")
            kek = self._keks[version] = AESGCM(raw)
        return kek

    def wrap(self, data_key: bytes, context: str) -> WrappedKey:
        version = self.current_version()
        nonce = secrets.token_bytes(12)
        return WrappedKey(version, nonce + self._kek(version).encrypt(nonce, data_key, context.encode()))

    def unwrap(self, wrapped: WrappedKey, context: str) -> bytes:
        try:
            kek = self._kek(wrapped.kek_version)
            return kek.decrypt(wrapped.blob[:12], wrapped.blob[12:], context.encode())
        except InvalidTag:
            raise PayloadKeyError(context, f"the wrapped data key does not open under KEK version "
                                           f"{wrapped.kek_version}") from None

    def rotate(self) -> int:
        with self._lock:
            new = self.current_version() + 1
            _write_private(self._path(new), secrets.token_bytes(_KEY_BYTES))
            _write_private(self.dir / "current", str(new).encode())
            return new

    def retire(self, below: int) -> list[int]:
        current = self.current_version()
        if below > current:
            raise ConfigError(f"cannot retire KEK versions up to the current one (v{current})")
        gone = []
        for path in sorted(self.dir.glob("v*.key")):
            version = int(path.stem[1:])
            if version < below:
                path.unlink()
                self._keks.pop(version, None)
                gone.append(version)
        return gone


class _Generation:
    """A counter every process of a keyring shares through a memory-mapped file (``<keyring>/generation``,
    8 bytes, 0600): an erase bumps it, and a cached data key is used without any file system call while
    the counter is where it was when the key was last checked against its file. So an erase made by
    another process still takes effect at the next payload, for the price of a memory read per payload
    instead of a ``stat``. (A keyring on a network file system may not share the mapping: keep it local.)"""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._map: mmap.mmap | None = None
        self._lock = threading.Lock()

    def _mapped(self) -> mmap.mmap:
        m = self._map
        if m is None:
            with self._lock:
                if self._map is None:
                    _private_dir(self.path.parent)
                    _create_private(self.path, bytes(8))
                    _check_private(self.path)
                    fd = os.open(self.path, os.O_RDWR)
                    try:
                        self._map = mmap.mmap(fd, 8)
                    finally:
                        os.close(fd)
                m = self._map
        return m

    def value(self) -> bytes:
        """The counter's 8 bytes as they are (compared for equality only: no int made per payload)."""
        m = self._map
        return (m if m is not None else self._mapped())[:8]

    def bump(self) -> None:
        m = self._mapped()
        fd = os.open(self.path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # two erasers at once: both increments count
            m[:8] = (int.from_bytes(m[:8], "little") + 1).to_bytes(8, "little")
            m.flush()
        finally:
            os.close(fd)


@dataclass(frozen=True)
class DataKey:
    """One subject's data key and the keys derived from it (HMAC-SHA256 of the data key with a label):
    ``aead`` (AES-256-GCM, payload encryption), ``nonce_key`` (the synthetic nonce of an envelope) and
    ``hash_key`` (keyed content hashes)."""

    key_id: str
    aead: AESGCM
    nonce_key: bytes
    hash_key: bytes
    head: bytes = b""
    """An envelope's first 21 bytes under this key (magic + key id), made once."""
    nonce_base: Any = None
    """``blake2b(key=nonce_key, digest_size=12)`` before any data, made once: a nonce is a copy of it
    updated with the payload (the same digest as keying a new one, without hashing the key's block
    again each time: 0.6 us instead of 0.8 on a 200-byte payload)."""

    @classmethod
    def of(cls, key_id: str, raw: bytes) -> DataKey:
        def derive(label: bytes) -> bytes:
            return hmac.new(raw, b"runlog.v1." + label, hashlib.sha256).digest()

        nonce_key = derive(b"nonce")
        return cls(key_id, AESGCM(derive(b"enc")), nonce_key, derive(b"hash"),
                   b"\x00RLE\x01" + bytes.fromhex(key_id), blake2b(key=nonce_key, digest_size=12))


def _scrub(path: Path) -> None:
    """Overwrite ``path`` with random bytes, fsync, unlink: a destroyed wrapped key's bytes do not linger
    in the file's blocks. A file already gone (another process's erase) is fine."""
    try:
        size = path.stat().st_size
        with path.open("r+b") as f:
            f.write(secrets.token_bytes(size))
            f.flush()
            os.fsync(f.fileno())
        path.unlink()
    except FileNotFoundError:
        pass


def _destroyed(key_id: str) -> SubjectErased:
    return SubjectErased(key_id, f"subject {key_id} was erased: its data key is destroyed")


def _kept(cache: dict[_K, _V], key: _K, value: _V, limit: int) -> _V:
    """``cache[key] = value``, then the entry kept longest dropped while ``cache`` holds over ``limit``
    (another thread changing it meanwhile: the next insertion drops it instead)."""
    cache[key] = value
    while len(cache) > limit:
        try:
            del cache[next(iter(cache))]
        except (RuntimeError, StopIteration, KeyError):
            break
    return value


class SubjectKeys:
    """Each subject's data key: created on first use, wrapped by the provider's current KEK and kept in
    ``<root>/subjects/<key id>.json``; unwrapped keys cached in memory while their file exists.

    Args:
        root: the keyring directory (``RUNLOG_KEYRING``); made 0700.
        provider: the KEK provider (default: :class:`LocalKeyProvider` on the same directory).
        max_keys: how many subjects' unwrapped keys (and their ids and paths) one object keeps in memory;
            past it the longest kept is dropped (first in, first out) and read again from its file at its
            next use (with a transit provider, one call to the engine). A worker serving a key per
            customer keeps a bounded set, not every customer it ever served.
    """

    def __init__(self, root: str | os.PathLike[str], provider: KeyProvider | None = None, *,
                 max_keys: int = 10_000) -> None:
        if max_keys < 1:
            raise ValueError(f"max_keys must be at least 1, not {max_keys}")
        self.max_keys = max_keys
        self.root = Path(root)
        _private_dir(self.root)
        self.provider = provider or LocalKeyProvider(self.root)
        self._subjects = self.root / "subjects"
        self._erased = self.root / "erased"
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[DataKey, int, bytes]] = {}  # key id -> (key, file inode, generation)
        self._ids: dict[str, str] = {}  # subject -> key id (a sha256 saved per payload)
        self._subject_keys: dict[str, tuple[DataKey, bytes]] = {}  # subject -> (key, generation checked at)
        self._paths: dict[str, str] = {}  # key id -> its file's path as a str (os.stat without pathlib)
        self._generation = _Generation(self.root / "generation")

    def _file(self, key_id: str) -> Path:
        return self._subjects / f"{key_id}.json"

    def tombstone(self, key_id: str) -> dict[str, str] | None:
        """Who erased the subject with ``key_id``, why and when; None if it was not erased."""
        try:
            loaded: dict[str, str] = json.loads((self._erased / f"{key_id}.json").read_text())
            return loaded
        except FileNotFoundError:
            return None

    def is_erased(self, key_id: str) -> bool:
        return (self._erased / f"{key_id}.json").exists()

    def for_subject(self, subject: str) -> DataKey:
        """``subject``'s data key, made (and wrapped, and written) the first time.

        Raises:
            SubjectErased: the subject was erased; nothing more is written for it.
        """
        hit = self._subject_keys.get(subject)
        m = self._generation._map  # the counter read in place (what value() does, a call less per payload)
        if hit is not None and m is not None and hit[1] == m[:8]:
            return hit[0]  # the path of every payload sealed: no erase anywhere since it was checked
        key_id = self._ids.get(subject)
        if key_id is None:
            key_id = _kept(self._ids, subject, key_id_of(subject), self.max_keys)
        self._subject_keys.pop(subject, None)  # moved on, or its key's file changed: looked at again
        try:
            return self._checked(subject, key_id, self.by_id(key_id))
        except SubjectErased:
            raise
        except PayloadKeyError:
            if self._file(key_id).exists():
                # made by another process since the look above (a key that does not unwrap raises
                # again here): read, not made a second time
                return self.by_id(key_id)
        with self._lock:
            if self.is_erased(key_id):
                raise SubjectErased(key_id, f"subject {key_id} was erased: its payloads cannot be written")
            if not self._file(key_id).exists():
                raw = secrets.token_bytes(_KEY_BYTES)
                wrapped = self.provider.wrap(raw, key_id)
                _private_dir(self._subjects)
                # exclusively: a process making the same subject's key at the same moment either
                # wins or reads this one (two keys for one subject would leave payloads unreadable)
                _create_private(self._file(key_id), json.dumps({
                    "key_id": key_id, "kek_version": wrapped.kek_version,
                    "wrapped": base64.b64encode(wrapped.blob).decode("ascii"),
                    "created_at": int(time.time() * 1000)}, sort_keys=True).encode())
        return self.by_id(key_id)

    def _checked(self, subject: str, key_id: str, key: DataKey) -> DataKey:
        """``key``, remembered as ``subject``'s under the generation :meth:`by_id` checked it at (read
        before its look, so an erase made meanwhile is seen at the next payload)."""
        entry = self._cache.get(key_id)
        if entry is not None and entry[0] is key:
            _kept(self._subject_keys, subject, (key, entry[2]), self.max_keys)
        return key

    def by_id(self, key_id: str) -> DataKey:
        """The data key an envelope names.

        Raises:
            SubjectErased: its subject was erased.
            PayloadKeyError: no such key in this keyring, or it does not unwrap.
        """
        gen = self._generation.value()
        cached = self._cache.get(key_id)
        if cached is not None and cached[2] == gen:
            return cached[0]  # no erase anywhere since this key was checked: no file system call
        where = self._paths.get(key_id)
        if where is None:
            where = _kept(self._paths, key_id, str(self._file(key_id)), self.max_keys)
        try:
            st = os.stat(where)
        except FileNotFoundError:
            self._cache.pop(key_id, None)
            if self.is_erased(key_id):
                raise _destroyed(key_id) from None
            raise PayloadKeyError(key_id, f"no data key {key_id} in the keyring {self.root}") from None
        if st.st_mode & 0o077:
            _check_private(Path(where))  # a wrapped data key readable by others: refused, as a KEK is
        inode = st.st_ino
        if cached is not None and cached[1] == inode:
            self._refuse_if_erased(key_id)
            self._cache[key_id] = (cached[0], inode, gen)
            return cached[0]
        raw = self.provider.unwrap(self._wrapped(key_id, where), key_id)
        self._refuse_if_erased(key_id)
        key = DataKey.of(key_id, raw)
        _kept(self._cache, key_id, (key, inode, gen), self.max_keys)
        return key

    def _refuse_if_erased(self, key_id: str) -> None:
        """Raise SubjectErased, destroying the file, when a key file stands beside the subject's
        tombstone: written by a process that raced the erase (a rewrap renaming the key it re-wrapped
        into place, a first key made while the subject was being erased). The tombstone wins. Only on
        the path that looks at the file (a first use, or the erase generation moved), never per
        payload."""
        if self.is_erased(key_id):
            self._cache.pop(key_id, None)
            _scrub(self._file(key_id))
            raise _destroyed(key_id)

    def _wrapped(self, key_id: str, where: str | Path) -> WrappedKey:
        """The wrapped key the file at ``where`` holds (:meth:`_key_file`)."""
        return self._key_file(key_id, where)[1]

    def _key_file(self, key_id: str, where: str | Path) -> tuple[dict[str, Any], WrappedKey]:
        """The key file at ``where``: its fields, and the wrapped key they hold.

        Raises:
            SubjectErased: the file went, or holds no wrapped key, and the subject is erased: an erase
                (in another process) overwrote and unlinked it between a look and this read.
            PayloadKeyError: it went, or holds no wrapped key, and the subject is not erased.
        """
        try:
            doc = json.loads(Path(where).read_bytes())
            return doc, WrappedKey(int(doc["kek_version"]), base64.b64decode(doc["wrapped"], validate=True))
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError, ValueError, KeyError,
                TypeError) as err:  # ValueError: JSON, UTF-8, base64. Other OS errors (EIO...) as they are
            self._cache.pop(key_id, None)
            if self.is_erased(key_id):
                raise _destroyed(key_id) from None
            what = f"cannot be read ({err})" if isinstance(err, OSError) else \
                f"holds no wrapped key ({type(err).__name__})"
            raise PayloadKeyError(key_id, f"the data key file of {key_id} in the keyring {self.root} "
                                          f"{what}") from None

    def export(self, subject: str) -> bytes:
        """``subject``'s raw 32-byte data key, for an outside consumer that opens the subject's envelopes
        itself (docs: reference/contract, "The payload envelope"). Hand it over as a secret.

        Raises:
            SubjectErased: the subject was erased. PayloadKeyError: it has no data key here.
        """
        key_id = key_id_of(subject)
        self.by_id(key_id)  # erased / missing / not unwrapping: the typed errors
        return self.provider.unwrap(self._wrapped(key_id, self._file(key_id)), key_id)

    def erase(self, subject: str, *, by: str, reason: str) -> bool:
        """Destroy ``subject``'s data key (the wrapped file and the cached copy) and leave a tombstone.
        Returns False when it was already erased."""
        key_id = key_id_of(subject)
        with self._lock:
            was = self.is_erased(key_id)
            _private_dir(self._erased)
            if not was:
                _write_private(self._erased / f"{key_id}.json", json.dumps({
                    "key_id": key_id, "by": by, "reason": reason,
                    "at": int(time.time() * 1000)}, sort_keys=True).encode())
            _scrub(self._file(key_id))
            self._cache.pop(key_id, None)
            self._subject_keys.pop(subject, None)
            self._generation.bump()  # every process's cached keys are checked again at their next use
        return not was

    def rewrap(self) -> int:
        """Re-wrap every subject's data key under the provider's current KEK version (payloads untouched);
        the count re-wrapped."""
        count = 0
        current = self.provider.current_version()
        for path in sorted(self._subjects.glob("*.json")) if self._subjects.exists() else []:
            with self._lock:
                key_id = path.stem
                try:
                    _check_private(path)
                    # PayloadKeyError: a file that holds no wrapped key; its other fields (created_at) kept
                    doc, old = self._key_file(key_id, path)
                except (SubjectErased, FileNotFoundError):
                    continue  # erased (or being erased) since the listing: nothing to re-wrap
                if old.kek_version == current:
                    continue
                raw = self.provider.unwrap(old, key_id)
                wrapped = self.provider.wrap(raw, key_id)
                if self.is_erased(key_id):
                    continue  # an erase since the read: the key is not written back
                doc.update(key_id=key_id, kek_version=wrapped.kek_version,
                           wrapped=base64.b64encode(wrapped.blob).decode("ascii"))
                _write_private(path, json.dumps(doc, sort_keys=True).encode())
                self._cache.pop(key_id, None)
                if self.is_erased(key_id):  # erased while it was written: the tombstone wins
                    _scrub(path)
                    continue
                count += 1
        return count

    def kek_versions_in_use(self) -> set[int]:
        """The KEK versions some subject's wrapped key still needs (an erased subject's none)."""
        versions: set[int] = set()
        for path in self._subjects.glob("*.json") if self._subjects.exists() else []:
            try:
                versions.add(self._wrapped(path.stem, path).kek_version)
            except (SubjectErased, PayloadKeyError):
                continue
        return versions

