"""The transit key provider against a local service with the transit engine's documented request and
response shapes (``tests/transit_fake.py``); the real server's twin of these tests is
``tests/integration/resume/test_transit_vault.py``."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from runlog.producers.internal import (
    SealedArtifactStore,
    SubjectKeys,
    TransitKeyProvider,
    WrappedKey,
    key_provider,
    subject_keys,
)
from runlog.schemas import Settings
from runlog.schemas.errors import ConfigError, PayloadKeyError, SubjectErased
from runlog.testing import InMemoryArtifactStore
from tests.transit_fake import FakeTransit

TOKEN = "s.test-token-not-a-secret-7f3a"


@pytest.fixture
def transit() -> FakeTransit:
    with FakeTransit(TOKEN) as fake:
        fake.create_key("runlog")
        yield fake


def test_wrap_and_unwrap_through_the_engine_bound_to_the_subject(transit: FakeTransit) -> None:
    p = TransitKeyProvider(transit.addr, TOKEN)
    data_key = b"k" * 32
    w = p.wrap(data_key, "aa" * 16)
    assert w.kek_version == 1 and w.blob.startswith(b"vault:v1:") and data_key not in w.blob
    assert p.unwrap(w, "aa" * 16) == data_key
    with pytest.raises(PayloadKeyError, match="authentication failed"):
        p.unwrap(w, "bb" * 16)  # another subject's context does not open it
    sent = transit.requests[0]
    assert sent[0] == "POST" and sent[1] == "/v1/transit/encrypt/runlog" and sent[2]["X-Vault-Token"] == TOKEN


def test_rotate_rewraps_and_retire_refuses_old_versions(transit: FakeTransit, tmp_path: Path) -> None:
    p = TransitKeyProvider(transit.addr, TOKEN)
    keys = SubjectKeys(tmp_path / "kr", p)
    store = SealedArtifactStore(InMemoryArtifactStore(inline_max=0), keys, "cust-1")
    ref = store.put(b'{"card":"4242"}')
    assert p.current_version() == 1
    assert p.rotate() == 2
    assert keys.kek_versions_in_use() == {1}
    assert keys.rewrap() == 1 and keys.kek_versions_in_use() == {2}
    assert p.retire(2) == [1]
    fresh = SubjectKeys(tmp_path / "kr", p)  # no cached key: unwraps under v2
    assert SealedArtifactStore(store.base, fresh, "cust-1").get(ref) == b'{"card":"4242"}'
    with pytest.raises(PayloadKeyError, match="disallowed"):
        old = p.wrap(b"x" * 32, "cc" * 16).blob.replace(b"vault:v2:", b"vault:v1:")
        p.unwrap(WrappedKey(1, old), "cc" * 16)
    with pytest.raises(ConfigError, match="current one"):
        p.retire(5)
    fresh.erase("cust-1", by="dpo", reason="request")
    with pytest.raises(SubjectErased):
        SealedArtifactStore(store.base, SubjectKeys(tmp_path / "kr", p), "x").get(ref)


def test_a_refused_token_is_one_config_error_that_never_names_the_token(transit: FakeTransit) -> None:
    p = TransitKeyProvider(transit.addr, "s.wrong-token-123")
    with pytest.raises(ConfigError, match="refused the token") as err:
        p.wrap(b"k" * 32, "aa" * 16)
    assert "s.wrong-token-123" not in str(err.value)
    assert "s.wrong-token-123" not in repr(p) and TOKEN not in repr(TransitKeyProvider(transit.addr, TOKEN))


def test_an_unreachable_engine_is_a_payload_key_error() -> None:
    p = TransitKeyProvider("http://127.0.0.1:1", TOKEN, timeout=2)
    with pytest.raises(PayloadKeyError, match="unreachable"):
        p.current_version()


def test_settings_choose_the_transit_provider_and_mask_its_token(transit: FakeTransit,
                                                                tmp_path: Path) -> None:
    s = Settings.from_env({"RUNLOG_ENCRYPTION": "true", "RUNLOG_KEYRING": str(tmp_path / "kr"),
                           "RUNLOG_KEY_PROVIDER": "transit", "RUNLOG_TRANSIT_ADDR": transit.addr,
                           "RUNLOG_TRANSIT_TOKEN": TOKEN})
    assert TOKEN not in repr(s) and s.redacted()["transit_token"] == "***"
    assert isinstance(key_provider(s), TransitKeyProvider)
    keys = subject_keys(s)
    assert keys is subject_keys(s)  # one per process and configuration
    key = keys.for_subject("cust-9")
    assert keys.by_id(key.key_id) is key
    doc = (tmp_path / "kr" / "subjects" / f"{key.key_id}.json").read_text()
    assert '"kek_version": 1' in doc and "vault:v1:" in base64.b64decode(
        __import__("json").loads(doc)["wrapped"]).decode()
    assert not (tmp_path / "kr" / "kek").exists()  # no local KEK: the engine holds it
    with pytest.raises(ConfigError, match="RUNLOG_TRANSIT_ADDR"):
        key_provider(s.with_(transit_addr=None))
    with pytest.raises(ConfigError, match="local or transit"):
        Settings.from_env({"RUNLOG_KEY_PROVIDER": "kms"})
