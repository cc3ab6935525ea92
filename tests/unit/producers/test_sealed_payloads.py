"""Payload encryption without services: envelopes, keyed hashes, the keyring's files, erase and rotation."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from runlog.producers.base._keyring import LocalKeyProvider, WrappedKey
from runlog.producers.internal import SealedArtifactStore, SubjectKeys, key_id_of, open_text, seal_text
from runlog.schemas.errors import ConfigError, PayloadKeyError, SubjectErased
from runlog.testing import InMemoryArtifactStore


def _store(root: Path, subject: str = "cust-1", inline_max: int = 512) -> SealedArtifactStore:
    return SealedArtifactStore(InMemoryArtifactStore(inline_max=inline_max), SubjectKeys(root), subject)


def test_an_inline_ref_carries_the_envelope_not_the_payload(tmp_path: Path) -> None:
    store = _store(tmp_path)
    ref = store.inline(b'{"card":"4242"}', "application/json")
    assert ref is not None and ref.uri.startswith("data:application/json;base64,")
    import base64
    carried = base64.b64decode(ref.uri.partition(",")[2])
    assert b"4242" not in carried and carried.startswith(b"\x00RLE\x01")
    assert ref.sha256 == hashlib.sha256(carried).hexdigest() != hashlib.sha256(b'{"card":"4242"}').hexdigest()
    assert store.get(ref) == b'{"card":"4242"}'


def test_sealing_is_deterministic_per_subject_and_differs_between_subjects(tmp_path: Path) -> None:
    a, b = _store(tmp_path, "cust-a", 0), _store(tmp_path, "cust-b", 0)
    assert a.put(b"same").sha256 == a.put(b"same").sha256 == a.content_id(b"same")
    assert a.put(b"same").sha256 != b.put(b"same").sha256
    assert a.digest(b"yes") != hashlib.sha256(b"yes").hexdigest()  # keyed: not guessable from a short answer
    assert a.digest(b"yes") != b.digest(b"yes")


def test_a_payload_opens_by_its_key_id_under_any_subject_view(tmp_path: Path) -> None:
    a = _store(tmp_path, "cust-a", 0)
    ref = a.put(b"hello")
    other = SealedArtifactStore(a.base, SubjectKeys(tmp_path), "someone-else")
    assert other.get(ref) == b"hello"
    assert other.get(a.base.put(b"plain, written before encryption")) == b"plain, written before encryption"


def test_the_keyring_is_its_owners_only(tmp_path: Path) -> None:
    _store(tmp_path / "k").put(b"x")
    root = tmp_path / "k"
    assert root.stat().st_mode & 0o777 == 0o700
    assert all(p.stat().st_mode & 0o777 == (0o700 if p.is_dir() else 0o600) for p in root.rglob("*"))
    kek = root / "kek" / "v1.key"
    kek.chmod(0o644)
    with pytest.raises(Exception, match="readable by others"):
        _store(root, "cust-new").put(b"y")


def test_a_subject_key_file_readable_by_others_is_refused_as_a_kek_is(tmp_path: Path) -> None:
    """Only the KEK files and ``generation`` were checked: a wrapped data key left 0644 was read."""
    root = tmp_path / "k"
    _store(root, "cust-a").put(b"x")
    key_id = key_id_of("cust-a")
    (root / "subjects" / f"{key_id}.json").chmod(0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        SubjectKeys(root).by_id(key_id)  # a fresh reader (another process)
    with pytest.raises(ConfigError, match="readable by others"):
        SubjectKeys(root).rewrap()
    (root / "subjects" / f"{key_id}.json").chmod(0o600)
    assert SubjectKeys(root).by_id(key_id).key_id == key_id


def test_erase_destroys_the_key_everywhere_and_refuses_new_writes(tmp_path: Path) -> None:
    store = _store(tmp_path, "cust-a", 0)
    ref = store.put(b"secret")
    store.put(b"again")  # the writer's key now comes from its keyring's per-subject fast path
    assert "cust-a" in store.keys._subject_keys
    reader = SubjectKeys(tmp_path)  # another process's keyring object, its cache warm
    assert SealedArtifactStore(store.base, reader, "x").get(ref) == b"secret"
    assert SubjectKeys(tmp_path).erase("cust-a", by="dpo", reason="request")
    with pytest.raises(SubjectErased):
        SealedArtifactStore(store.base, reader, "x").get(ref)  # the cached copy is gone too
    with pytest.raises(SubjectErased):
        store.put(b"more")
    assert "cust-a" not in store.keys._subject_keys  # the writer holds no copy of the erased key
    assert not SubjectKeys(tmp_path).erase("cust-a", by="dpo", reason="again")
    tomb = json.loads((tmp_path / "erased" / f"{key_id_of('cust-a')}.json").read_text())
    assert tomb["by"] == "dpo" and tomb["reason"] == "request"
    bob = _store(tmp_path, "cust-b", 0)
    assert bob.get(bob.put(b"ok")) == b"ok"  # another subject is untouched


def test_rotation_rewraps_data_keys_and_old_payloads_still_open(tmp_path: Path) -> None:
    store = _store(tmp_path, "cust-a", 0)
    ref = store.put(b"before rotation")
    keys = SubjectKeys(tmp_path)
    assert keys.provider.rotate() == 2
    assert keys.rewrap() == 1 and keys.kek_versions_in_use() == {2}
    assert keys.provider.retire(2) == [1]
    assert SealedArtifactStore(store.base, SubjectKeys(tmp_path), "x").get(ref) == b"before rotation"


def test_a_tampered_envelope_or_an_unknown_key_is_a_payload_key_error(tmp_path: Path) -> None:
    store = _store(tmp_path, "cust-a", 0)
    ref = store.put(b"data")
    envelope = bytearray(store.base.get(ref))
    envelope[-1] ^= 1
    from runlog.producers.internal import SealedArtifactStore as S
    bad = S(InMemoryArtifactStore(), SubjectKeys(tmp_path), "x")
    tampered = bad.base.put(bytes(envelope))
    with pytest.raises(PayloadKeyError, match="does not authenticate"):
        bad.get(tampered)
    with pytest.raises(PayloadKeyError, match="no data key"):
        S(store.base, SubjectKeys(tmp_path / "elsewhere"), "x").get(ref)


def test_sealed_text_fields_round_trip(tmp_path: Path) -> None:
    keys = SubjectKeys(tmp_path)
    sealed = seal_text(keys.for_subject("cust-a"), "partial answer")
    assert "partial" not in sealed and open_text(keys, sealed) == "partial answer"
    assert open_text(keys, "clear text") == "clear text"


def _make_key(root: str, go: object, out: object) -> None:
    """A process that opens a fresh keyring and makes one subject's key when told to."""
    go.wait()  # type: ignore[attr-defined]
    out.put(SubjectKeys(root).for_subject("customer-1").hash_key.hex())  # type: ignore[attr-defined]


def test_processes_making_one_subject_key_at_once_agree_on_one_key(tmp_path: Path) -> None:
    """A worker and a resumer new to a subject at the same moment: without an exclusive create, the
    last writer's key replaced the first's and the payloads sealed under it no longer opened."""
    import multiprocessing as mp

    ctx = mp.get_context("fork")
    for attempt in range(5):
        root = str(tmp_path / f"keyring-{attempt}")
        go, out = ctx.Barrier(6), ctx.Queue()
        procs = [ctx.Process(target=_make_key, args=(root, go, out)) for _ in range(6)]
        for p in procs:
            p.start()
        keys = {out.get(timeout=30) for _ in procs}
        for p in procs:
            p.join(30)
        assert len(keys) == 1, keys
        assert SubjectKeys(root).for_subject("customer-1").hash_key.hex() in keys


def test_the_nonce_from_the_keyed_state_made_once_is_the_keyed_blake2b_of_the_payload(tmp_path: Path) -> None:
    """``DataKey.nonce_base`` (a keyed BLAKE2b state copied per payload) gives the envelope keying a new
    BLAKE2b each time gave: envelopes stay byte for byte what they were."""
    import dataclasses
    from hashlib import blake2b

    from runlog.producers.base._envelope import MAGIC, seal

    key = SubjectKeys(tmp_path).for_subject("cust-a")
    assert key.nonce_base is not None
    for payload in (b"", b"x", b'{"answer": 42}' * 40):
        env = seal(key, payload)
        assert env == seal(dataclasses.replace(key, nonce_base=None), payload)
        head = len(MAGIC) + 16
        assert env[head:head + 12] == blake2b(payload, key=key.nonce_key, digest_size=12).digest()


def _mid_erase(root: Path, subject: str, *, tombstone: bool) -> Path:
    """The keyring as another process's erase leaves it between its overwrite and its unlink: the
    tombstone written (or not), the wrapped key's file holding random bytes."""
    key_id = key_id_of(subject)
    if tombstone:
        (root / "erased").mkdir(mode=0o700, exist_ok=True)
        (root / "erased" / f"{key_id}.json").write_text(json.dumps({"key_id": key_id}))
    path = root / "subjects" / f"{key_id}.json"
    path.write_bytes(b"\xff\x00" + bytes(range(256)) * 2)
    return path


def test_a_read_racing_an_erase_is_subject_erased_not_a_parse_error(tmp_path: Path) -> None:
    store = _store(tmp_path, "cust-a", 0)
    ref = store.put(b"secret")
    _mid_erase(tmp_path, "cust-a", tombstone=True)
    keys = SubjectKeys(tmp_path)  # a process that never held the key: it reads the file
    with pytest.raises(SubjectErased):
        keys.by_id(key_id_of("cust-a"))
    with pytest.raises(SubjectErased):
        SealedArtifactStore(InMemoryArtifactStore(), keys, "cust-a").put(b"more")
    with pytest.raises(SubjectErased):
        keys.export("cust-a")
    with pytest.raises(SubjectErased):
        SealedArtifactStore(store.base, SubjectKeys(tmp_path), "x").get(ref)


def test_a_key_file_unlinked_between_the_look_and_the_read_is_subject_erased(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _store(tmp_path, "cust-a", 0).put(b"secret")
    key_id = key_id_of("cust-a")
    keys = SubjectKeys(tmp_path)
    real = Path.read_bytes

    def erased_meanwhile(self: Path) -> bytes:
        if self.name == f"{key_id}.json" and self.parent.name == "subjects":
            _mid_erase(tmp_path, "cust-a", tombstone=True).unlink()
        return real(self)

    monkeypatch.setattr(Path, "read_bytes", erased_meanwhile)
    with pytest.raises(SubjectErased):
        keys.by_id(key_id)


def test_a_key_file_holding_no_wrapped_key_is_a_payload_key_error(tmp_path: Path) -> None:
    _store(tmp_path, "cust-a", 0).put(b"secret")
    _mid_erase(tmp_path, "cust-a", tombstone=False)
    with pytest.raises(PayloadKeyError, match="holds no wrapped key"):
        SubjectKeys(tmp_path).by_id(key_id_of("cust-a"))
    (tmp_path / "subjects" / f"{key_id_of('cust-a')}.json").write_text(json.dumps({"kek_version": 1}))
    with pytest.raises(PayloadKeyError, match="KeyError"):
        SubjectKeys(tmp_path).by_id(key_id_of("cust-a"))
    path = tmp_path / "subjects" / f"{key_id_of('cust-a')}.json"
    path.unlink()
    path.mkdir(mode=0o700)  # not a file: the read fails with an OSError
    with pytest.raises(PayloadKeyError, match="cannot be read"):
        SubjectKeys(tmp_path).by_id(key_id_of("cust-a"))


def test_a_keyring_keeps_a_bounded_set_of_keys_and_reads_an_evicted_one_again(tmp_path: Path) -> None:
    keys = SubjectKeys(tmp_path, max_keys=3)
    stores = {f"cust-{i}": SealedArtifactStore(InMemoryArtifactStore(), keys, f"cust-{i}") for i in range(10)}
    refs = {subject: store.put(subject.encode()) for subject, store in stores.items()}
    first = keys.for_subject("cust-9")
    for cache in (keys._cache, keys._ids, keys._subject_keys, keys._paths):
        assert 0 < len(cache) <= 3
    assert "cust-0" not in keys._subject_keys and key_id_of("cust-0") not in keys._cache
    unwraps: list[str] = []
    real_unwrap = keys.provider.unwrap
    keys.provider.unwrap = lambda wrapped, ctx: unwraps.append(ctx) or real_unwrap(wrapped, ctx)  # type: ignore[method-assign]
    assert keys.for_subject("cust-9") is first and unwraps == []  # kept: no file read, no unwrap
    assert stores["cust-0"].get(refs["cust-0"]) == b"cust-0"  # dropped: read again from its file
    assert unwraps == [key_id_of("cust-0")]
    assert stores["cust-0"].put(b"cust-0") == refs["cust-0"]  # the same key: the same envelope
    assert keys.erase("cust-1", by="dpo", reason="request")  # dropped long ago: erased all the same
    with pytest.raises(SubjectErased):
        stores["cust-1"].get(refs["cust-1"])
    with pytest.raises(ValueError, match="max_keys"):
        SubjectKeys(tmp_path, max_keys=0)


class _ErasingProvider(LocalKeyProvider):
    """A KEK provider that erases ``subject`` through another process's keyring while it wraps: the erase
    lands between a keyring's read of a key and its write of the key (re-)wrapped."""

    def __init__(self, root: Path, subject: str) -> None:
        super().__init__(root)
        self.root, self.subject = root, subject

    def wrap(self, data_key: bytes, context: str) -> WrappedKey:
        out = super().wrap(data_key, context)
        SubjectKeys(self.root).erase(self.subject, by="dpo", reason="request")
        return out


def test_a_rewrap_racing_an_erase_does_not_bring_the_key_back(tmp_path: Path) -> None:
    store = _store(tmp_path, "cust-a", 0)
    ref = store.put(b"secret")
    keys = SubjectKeys(tmp_path, _ErasingProvider(tmp_path, "cust-a"))
    keys.provider.rotate()
    assert keys.rewrap() == 0  # erased before its re-wrapped key was written back
    assert not (tmp_path / "subjects" / f"{key_id_of('cust-a')}.json").exists()
    with pytest.raises(SubjectErased):
        SubjectKeys(tmp_path).for_subject("cust-a")
    with pytest.raises(SubjectErased):
        SealedArtifactStore(store.base, SubjectKeys(tmp_path), "x").get(ref)
    assert SubjectKeys(tmp_path).kek_versions_in_use() == set()


def test_a_first_key_made_while_its_subject_is_erased_is_destroyed_not_used(tmp_path: Path) -> None:
    keys = SubjectKeys(tmp_path, _ErasingProvider(tmp_path, "cust-a"))
    with pytest.raises(SubjectErased):
        keys.for_subject("cust-a")  # its file was written after the tombstone
    assert not (tmp_path / "subjects" / f"{key_id_of('cust-a')}.json").exists()
    with pytest.raises(SubjectErased):
        SubjectKeys(tmp_path).for_subject("cust-a")


def test_a_key_file_beside_a_tombstone_is_never_a_key(tmp_path: Path) -> None:
    """However it got there (a process that raced an erase), the tombstone wins: the file is destroyed
    at its first read, in a fresh process and in one holding the key since before the erase."""
    store = _store(tmp_path, "cust-a", 0)
    ref = store.put(b"secret")
    path = tmp_path / "subjects" / f"{key_id_of('cust-a')}.json"
    saved = path.read_bytes()
    assert SubjectKeys(tmp_path).erase("cust-a", by="dpo", reason="request")
    path.write_bytes(saved)  # back beside its tombstone
    path.chmod(0o600)
    with pytest.raises(SubjectErased):
        store.get(ref)  # the writer's keyring held the key: the generation moved, the file is looked at
    assert not path.exists()
    path.write_bytes(saved)
    path.chmod(0o600)
    with pytest.raises(SubjectErased):
        SubjectKeys(tmp_path).by_id(key_id_of("cust-a"))
    assert not path.exists()
