"""The transit key provider against a real HashiCorp Vault server (a dev server, in memory, built from its Go
module by ``deploy/local/vault build``), with Runlog's real Kafka and Redis: what
``tests/unit/producers/test_transit_provider.py`` checks against a stand-in of the API, here against the
engine itself, and an encrypted run that crashes, resumes across a KEK rotation and is erased."""

from __future__ import annotations

import base64
import json
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runlog.processors.audit import AuditOptions, audit
from runlog.processors.chaos.services import free_ports, stop_process
from runlog.processors.erase import erase_subject
from runlog.producers import DictInputSource, Runner
from runlog.producers.internal import (
    SealedArtifactStore,
    SubjectKeys,
    TransitKeyProvider,
    WrappedKey,
    store_from_settings,
)
from runlog.schemas import Settings
from runlog.schemas.errors import ConfigError, PayloadKeyError, SubjectErased
from runlog.testing import InMemoryArtifactStore
from tests.conftest import require
from tests.integration.resume._toy import toy
from tests.integration.resume._workers import resume_after_crash
from tests.integration.resume.conftest import accepted, log_of
from tests.integration.resume.test_privacy import _crash_for
from tests.transit_fake import FakeTransit

ROOT = Path(__file__).resolve().parents[3]

# on a machine's first run deploy/test builds Vault beside the suite (deploy/env.sh): the first test here
# may wait for that build (deploy/local/vault's lock), longer than the suite's 600 s per test
pytestmark = pytest.mark.timeout(3900)


@dataclass(frozen=True)
class Vault:
    addr: str
    token: str

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        req = urllib.request.Request(f"{self.addr}/v1/{path}", method=method,
                                     data=None if body is None else json.dumps(body).encode(),
                                     headers={"X-Vault-Token": self.token})
        with urllib.request.urlopen(req, timeout=10) as resp:
            raw = resp.read()
        return json.loads(raw) if raw else {}

    def new_key(self) -> str:
        """A fresh transit key as the privacy how-to creates it (aes256-gcm96, derived)."""
        name = f"runlog-{uuid.uuid4().hex[:8]}"
        self.call("POST", f"transit/keys/{name}", {"type": "aes256-gcm96", "derived": True})
        return name


def _vault_binary() -> Path | None:
    try:  # beyond the script's own 3,600 s wait for a build under way, so its message is the one seen
        proc = subprocess.run([str(ROOT / "deploy" / "local" / "vault"), "build"], capture_output=True,
                              text=True, timeout=3750, check=False)
    except subprocess.TimeoutExpired as err:
        require(False, f"deploy/local/vault build did not finish in {err.timeout:.0f} s")
        return None
    path = Path(proc.stdout.strip()) if proc.returncode == 0 and proc.stdout.strip() else None
    require(path is not None and path.is_file(), f"no Vault binary: {proc.stderr[-1500:]}")
    return path


def _port_pair() -> int:
    """A free port whose next port is free too: a dev server listens on both (API, cluster)."""
    for _ in range(50):
        (port,) = free_ports(1)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
            except OSError:
                continue
        return port
    raise RuntimeError("no two consecutive free ports")


@pytest.fixture(scope="module")
def real_vault(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Vault]:
    binary = _vault_binary()
    assert binary is not None
    port = _port_pair()
    # the dev server's root token, made here for this server alone; through its environment, not its
    # command line (which ps shows); its banner in vault.log (pytest's temporary folder) prints it
    token = secrets.token_urlsafe(24)
    d = tmp_path_factory.mktemp("vault")
    with open(d / "vault.log", "wb") as out:
        proc = subprocess.Popen([str(binary), "server", "-dev", "-dev-no-store-token",
                                 f"-dev-listen-address=127.0.0.1:{port}"],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True,
                                env={"PATH": os.environ.get("PATH", ""), "HOME": str(d),
                                     "VAULT_DEV_ROOT_TOKEN_ID": token})
    v = Vault(f"http://127.0.0.1:{port}", token)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{v.addr}/v1/sys/health", timeout=2) as resp:
                    if json.loads(resp.read()).get("sealed") is False:
                        break
            except (OSError, ValueError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"vault did not answer on {port}: {(d / 'vault.log').read_text()[-2000:]}")
            time.sleep(0.2)
        v.call("POST", "sys/mounts/transit", {"type": "transit"})
        yield v
    finally:
        stop_process(proc, wait=15)


@pytest.fixture(params=["vault", "stand-in"])
def transit(request: pytest.FixtureRequest) -> Iterator[Vault]:
    """The real server, and the unit tests' stand-in of its API (``tests/transit_fake.py``): one contract."""
    if request.param == "vault":
        yield request.getfixturevalue("real_vault")
        return
    token = secrets.token_urlsafe(24)
    with FakeTransit(token) as fake:
        yield Vault(fake.addr, token)


def test_the_provider_wraps_rotates_retires_and_is_refused_by_the_engine(transit: Vault,
                                                                          tmp_path: Path) -> None:
    vault = transit
    key = vault.new_key()
    p = TransitKeyProvider(vault.addr, vault.token, key=key)
    data_key = secrets.token_bytes(32)
    w = p.wrap(data_key, "aa" * 16)
    assert w.kek_version == 1 and w.blob.startswith(b"vault:v1:") and data_key not in w.blob
    assert p.unwrap(w, "aa" * 16) == data_key
    with pytest.raises(PayloadKeyError, match="authentication failed"):
        p.unwrap(w, "bb" * 16)  # another subject's context: the derived key differs

    keys = SubjectKeys(tmp_path / "kr", p)
    store = SealedArtifactStore(InMemoryArtifactStore(inline_max=0), keys, "cust-1")
    ref = store.put(b'{"card":"4242"}')
    assert p.current_version() == 1
    assert p.rotate() == 2 and vault.call("GET", f"transit/keys/{key}")["data"]["latest_version"] == 2
    assert keys.kek_versions_in_use() == {1}
    assert keys.rewrap() == 1 and keys.kek_versions_in_use() == {2}
    assert p.retire(2) == [1]
    assert vault.call("GET", f"transit/keys/{key}")["data"]["min_decryption_version"] == 2
    fresh = SubjectKeys(tmp_path / "kr", p)  # no cached key: unwraps under v2 on the server
    assert SealedArtifactStore(store.base, fresh, "cust-1").get(ref) == b'{"card":"4242"}'
    with pytest.raises(PayloadKeyError, match="disallowed"):
        p.unwrap(w, "aa" * 16)  # a v1 ciphertext, below the server's min_decryption_version
    with pytest.raises(ConfigError, match="current one"):
        p.retire(5)

    wrong = TransitKeyProvider(vault.addr, "hvs.not-the-token-" + secrets.token_hex(4), key=key)
    with pytest.raises(ConfigError, match="refused the token") as err:
        wrong.wrap(data_key, "aa" * 16)
    assert "not-the-token" not in str(err.value) and vault.token not in str(err.value)
    with pytest.raises(PayloadKeyError, match=r"404\b.*no handler for route"):
        TransitKeyProvider(vault.addr, vault.token, key=key, mount="no-such-mount").current_version()


def _cli(settings: Settings, *args: str) -> subprocess.CompletedProcess[str]:
    """``runlog ARGS`` in a child process configured by the environment alone (the token included)."""
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}, **settings.to_env()}
    return subprocess.run([sys.executable, "-m", "runlog", *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=180, check=False)


@pytest.mark.slow  # two crashed runs, a resume after a lease expiry, two CLI processes, an erase and an audit
def test_a_run_sealed_under_vault_resumes_across_a_rotation_and_its_subject_is_erased(
        real_vault: Vault, topics: Settings, tmp_path: Path) -> None:
    vault = real_vault
    key = vault.new_key()
    s = topics.with_(encryption=True, keyring=str(tmp_path / "keyring"), key_provider="transit",
                     transit_addr=vault.addr, transit_token=vault.token, transit_key=key)
    t = toy("vault")
    alice_secret, bob_secret = f"alice-{uuid.uuid4().hex}", f"bob-{uuid.uuid4().hex}"
    alice = _crash_for(s, t, "cust-alice", alice_secret)
    bob = _crash_for(s, t, "cust-bob", bob_secret)
    # the wrapped data keys are Vault's ciphertexts under the derived key; no KEK file here
    docs = {f.stem: base64.b64decode(json.loads(f.read_text())["wrapped"]).decode()
            for f in (tmp_path / "keyring" / "subjects").glob("*.json")}
    assert len(docs) == 2 and all(w.startswith("vault:v1:") for w in docs.values())
    assert not (tmp_path / "keyring" / "kek").exists()

    # `runlog keys rotate` in a process of its own: the token reaches it through RUNLOG_TRANSIT_TOKEN only
    rotated = _cli(s, "keys", "rotate", "--json")
    assert rotated.returncode == 0, rotated.stderr
    assert json.loads(rotated.stdout) == {"kek_version": 2, "rewrapped": 2}
    assert vault.token not in rotated.stdout + rotated.stderr
    retired = _cli(s, "keys", "retire", "--json")
    assert retired.returncode == 0 and json.loads(retired.stdout) == {"retired": [1]}, retired.stderr

    # bob's run, started under v1, resumes after the rotation and the retirement of v1
    outcome = resume_after_crash(s, t.app(), bob)
    assert outcome.result == "completed", outcome
    b_state = accepted(log_of(s, bob))[-1].state
    assert b_state.params_ref is not None
    assert json.loads(store_from_settings(s).get(b_state.params_ref))["q"] == bob_secret
    provider = TransitKeyProvider(vault.addr, vault.token, key=key)
    assert SubjectKeys(tmp_path / "keyring", provider).kek_versions_in_use() == {2}

    res = erase_subject(s, "cust-alice", by="dpo@example.test", reason="deletion request 7")
    assert res.destroyed and res.runs == [alice] and res.blocked == [alice]
    a_state = accepted(log_of(s, alice))[-1].state
    assert a_state.params_ref is not None
    with pytest.raises(SubjectErased):
        store_from_settings(s).get(a_state.params_ref)
    with Runner.from_settings(s, source=DictInputSource({})) as runner, pytest.raises(SubjectErased):
        runner.run(t.workflow, {"q": "again"}, subject="cust-alice")
    report = audit(s, AuditOptions(), progress=None)
    assert report.findings == [], [f.to_dict() for f in report.findings]
    assert report.erased == [alice]
    # Vault's own view: a data key wrapped under v1 no longer unwraps there (v1 is below the key's
    # min_decryption_version; the server refuses it on its version, before its context is read)
    info = vault.call("GET", f"transit/keys/{key}")["data"]
    assert info["latest_version"] == 2 and info["min_decryption_version"] == 2
    key_id, old = next(iter(docs.items()))
    with pytest.raises(PayloadKeyError, match="disallowed"):
        provider.unwrap(WrappedKey(1, old.encode()), key_id)
