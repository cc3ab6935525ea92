"""The projector receives every Kafka security setting the other clients get, or refuses to start
naming the one it cannot honour (``runlog.processors.projector._security``).

TLS mappings are checked by a real handshake against an in-process TLS server on loopback (the
only way to see which CA, client certificate and host name check a context really uses).
"""

from __future__ import annotations

import base64
import datetime as dt
import http.server
import ipaddress
import json
import shutil
import socket
import ssl
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import faust
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.serialization import pkcs12
from cryptography.x509.oid import NameOID

from runlog.processors.projector import ProjectorOptions, faust_credentials, faust_settings
from runlog.processors.projector._security import (
    HONOURED,
    NOT_SECURITY,
    REFUSED,
    OidcTokenProvider,
    broker_credentials,
    ssl_context,
)
from runlog.schemas import ConfigError, Settings
from tests.conftest import require

# -- a small PKI: CA, server certificate for 127.0.0.1, client certificate --------------------------


@dataclass(frozen=True)
class Pki:
    ca_pem: str
    ca_key: Any
    server_pem: str
    server_key_pem: str
    client_pem: str
    client_key_pem: str
    client_key_encrypted_pem: str
    client_key: Any
    client_cert: Any
    other_ca_pem: str


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def _cert(subject: str, key: Any, issuer: str, issuer_key: Any, *, ca: bool = False,
          san: list[x509.GeneralName] | None = None) -> x509.Certificate:
    now = dt.datetime.now(dt.UTC)
    b = (x509.CertificateBuilder().subject_name(_name(subject)).issuer_name(_name(issuer))
         .public_key(key.public_key()).serial_number(x509.random_serial_number())
         .not_valid_before(now - dt.timedelta(minutes=5)).not_valid_after(now + dt.timedelta(days=2))
         .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if san:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return b.sign(issuer_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _key_pem(key: Any, password: bytes | None = None) -> str:
    enc = (serialization.BestAvailableEncryption(password) if password
           else serialization.NoEncryption())
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, enc).decode()


def make_pki(key_factory: Any = None) -> Pki:
    new_key = key_factory or (lambda: ec.generate_private_key(ec.SECP256R1()))
    ca_key, other_key, server_key, client_key = new_key(), new_key(), new_key(), new_key()
    ca = _cert("runlog-test-ca", ca_key, "runlog-test-ca", ca_key, ca=True)
    other = _cert("someone-else-ca", other_key, "someone-else-ca", other_key, ca=True)
    server = _cert("kafka.test", server_key, "runlog-test-ca", ca_key,
                   san=[x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")])
    client = _cert("projector-client", client_key, "runlog-test-ca", ca_key)
    return Pki(_pem(ca), ca_key, _pem(server), _key_pem(server_key), _pem(client), _key_pem(client_key),
               _key_pem(client_key, b"k3y-pass"), client_key, client, _pem(other))


@pytest.fixture(scope="module")
def pki() -> Pki:
    return make_pki()


@pytest.fixture(scope="module")
def files(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    out = {}
    for name, text in (("ca", pki.ca_pem), ("client", pki.client_pem), ("client_key", pki.client_key_pem),
                       ("client_key_enc", pki.client_key_encrypted_pem), ("other_ca", pki.other_ca_pem)):
        (d / f"{name}.pem").write_text(text)
        out[name] = d / f"{name}.pem"
    cadir = d / "cadir"
    cadir.mkdir()
    (cadir / "ca.pem").write_text(pki.ca_pem)
    out["cadir"] = cadir
    p12 = pkcs12.serialize_key_and_certificates(b"projector", pki.client_key, pki.client_cert, None,
                                                serialization.BestAvailableEncryption(b"store-pass"))
    (d / "client.p12").write_bytes(p12)
    out["p12"] = d / "client.p12"
    return out


class TlsServer:
    """A TLS server on 127.0.0.1 that records the client certificate's CN of each handshake."""

    def __init__(self, pki: Pki, tmp: Path, *, require_client_cert: bool) -> None:
        (tmp / "server.pem").write_text(pki.server_pem)
        (tmp / "server.key").write_text(pki.server_key_pem)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(tmp / "server.pem", tmp / "server.key")
        if require_client_cert:
            self.ctx.verify_mode = ssl.CERT_REQUIRED
            self.ctx.load_verify_locations(cadata=pki.ca_pem)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.peers: list[str | None] = []
        self._t = threading.Thread(target=self._serve, daemon=True)
        self._t.start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            try:
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    cert = tls.getpeercert()
                    cn = None
                    if cert:
                        cn = next(v for rdn in cert["subject"] for k, v in rdn if k == "commonName")
                    self.peers.append(cn)
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                self.peers.append("<handshake failed>")

    def handshake(self, ctx: ssl.SSLContext, host: str = "127.0.0.1") -> bytes:
        with socket.create_connection(("127.0.0.1", self.port), timeout=5) as raw, \
                ctx.wrap_socket(raw, server_hostname=host) as tls:
            return tls.recv(2)

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def server(pki: Pki, tmp_path: Path) -> Iterator[TlsServer]:
    s = TlsServer(pki, tmp_path, require_client_cert=False)
    yield s
    s.close()


@pytest.fixture
def mtls(pki: Pki, tmp_path: Path) -> Iterator[TlsServer]:
    s = TlsServer(pki, tmp_path, require_client_cert=True)
    yield s
    s.close()


def extra(**kv: str) -> dict[str, str]:
    """librdkafka settings as ``Settings.from_env`` builds them from RUNLOG_KAFKA_* variables."""
    env = {"RUNLOG_KAFKA_" + k.upper(): v for k, v in kv.items()}
    return dict(Settings.from_env(env).kafka_extra)


# -- trust ------------------------------------------------------------------------------------------


def test_inline_ca_pem_is_trusted(pki: Pki, server: TlsServer) -> None:
    """The bug: an inline ssl.ca.pem was dropped and the projector failed CERTIFICATE_VERIFY_FAILED."""
    creds = faust_credentials(Settings.from_env({"RUNLOG_KAFKA_SECURITY_PROTOCOL": "SSL",
                                                 "RUNLOG_KAFKA_SSL_CA_PEM": pki.ca_pem}))
    assert isinstance(creds, faust.SSLCredentials)
    subjects = [dict(x[0] for x in c["subject"])["commonName"] for c in creds.context.get_ca_certs()]
    assert subjects == ["runlog-test-ca"]
    assert server.handshake(creds.context) == b"ok"


@pytest.mark.parametrize("which", ["file", "dir"])
def test_ca_location_file_or_directory(which: str, files: dict[str, Path], server: TlsServer) -> None:
    path = files["ca"] if which == "file" else files["cadir"]
    if which == "dir":  # a CA directory is looked up by subject hash links, as OpenSSL (and librdkafka) do
        require(shutil.which("openssl"), "openssl is needed to hash the CA directory")
        subprocess.run(["openssl", "rehash", str(path)], check=True, capture_output=True)
    ctx = ssl_context(extra(ssl_ca_location=str(path)))
    assert server.handshake(ctx) == b"ok"


def test_ca_location_and_pem_both_trusted(pki: Pki, files: dict[str, Path], server: TlsServer) -> None:
    ctx = ssl_context(extra(ssl_ca_location=str(files["other_ca"]), ssl_ca_pem=pki.ca_pem))
    assert len(ctx.get_ca_certs()) == 2
    assert server.handshake(ctx) == b"ok"


def test_a_wrong_ca_fails_verification(files: dict[str, Path], server: TlsServer) -> None:
    ctx = ssl_context(extra(ssl_ca_location=str(files["other_ca"])))
    with pytest.raises(ssl.SSLCertVerificationError):
        server.handshake(ctx)


def test_endpoint_identification(pki: Pki, server: TlsServer) -> None:
    strict = ssl_context(extra(ssl_ca_pem=pki.ca_pem))
    assert strict.check_hostname and strict.verify_mode == ssl.CERT_REQUIRED
    with pytest.raises(ssl.SSLCertVerificationError, match=r"mismatch|match"):
        server.handshake(strict, host="kafka.elsewhere.example")
    loose = ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_endpoint_identification_algorithm="none"))
    assert not loose.check_hostname and loose.verify_mode == ssl.CERT_REQUIRED
    assert server.handshake(loose, host="kafka.elsewhere.example") == b"ok"
    with pytest.raises(ssl.SSLCertVerificationError):  # the chain is still verified
        server.handshake(ssl_context(extra(ssl_endpoint_identification_algorithm="none")))


def test_certificate_verification_off_is_honoured(server: TlsServer) -> None:
    ctx = ssl_context(extra(enable_ssl_certificate_verification="false"))
    assert ctx.verify_mode == ssl.CERT_NONE and not ctx.check_hostname
    assert server.handshake(ctx) == b"ok"


def test_crl_location_turns_on_crl_checks(pki: Pki, tmp_path: Path) -> None:
    now = dt.datetime.now(dt.UTC)
    crl = (x509.CertificateRevocationListBuilder().issuer_name(_name("runlog-test-ca"))
           .last_update(now - dt.timedelta(minutes=1)).next_update(now + dt.timedelta(days=1))
           .sign(pki.ca_key, hashes.SHA256()))
    (tmp_path / "ca.crl").write_bytes(crl.public_bytes(serialization.Encoding.PEM))
    ctx = ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_crl_location=str(tmp_path / "ca.crl")))
    assert ctx.verify_flags & ssl.VERIFY_CRL_CHECK_LEAF


def test_cipher_suites(pki: Pki) -> None:
    ctx = ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_cipher_suites="ECDHE-ECDSA-AES128-GCM-SHA256"))
    tls12 = [c["name"] for c in ctx.get_ciphers() if c["protocol"] == "TLSv1.2"]
    assert tls12 == ["ECDHE-ECDSA-AES128-GCM-SHA256"]


def test_system_cas_without_a_ca_setting() -> None:
    assert ssl_context({}).verify_mode == ssl.CERT_REQUIRED


# -- client certificates ----------------------------------------------------------------------------


def test_client_certificate_from_files(pki: Pki, files: dict[str, Path], mtls: TlsServer) -> None:
    ctx = ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_certificate_location=str(files["client"]),
                            ssl_key_location=str(files["client_key"])))
    assert mtls.handshake(ctx) == b"ok"
    assert mtls.peers[-1] == "projector-client"


def test_client_certificate_inline_with_an_encrypted_key(pki: Pki, mtls: TlsServer, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    # a temporary directory of this test's own: the shared one holds other workers' runlog-tls-* files
    private = tmp_path / "tmp"
    private.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(private))
    made: list[str] = []
    real = tempfile.TemporaryDirectory

    def recorded(*args: Any, **kwargs: Any) -> Any:
        d = real(*args, **kwargs)
        made.append(d.name)
        return d

    monkeypatch.setattr(tempfile, "TemporaryDirectory", recorded)
    ctx = ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_certificate_pem=pki.client_pem,
                            ssl_key_pem=pki.client_key_encrypted_pem, ssl_key_password="k3y-pass"))
    assert mtls.handshake(ctx) == b"ok"
    assert mtls.peers[-1] == "projector-client"
    assert [Path(d).parent for d in made] == [private] and Path(made[0]).name.startswith("runlog-tls-")
    assert list(private.iterdir()) == []  # the key's temp file is gone


def test_encrypted_key_file_with_password(pki: Pki, files: dict[str, Path], mtls: TlsServer) -> None:
    ctx = ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_certificate_location=str(files["client"]),
                            ssl_key_location=str(files["client_key_enc"]), ssl_key_password="k3y-pass"))
    assert mtls.handshake(ctx) == b"ok"
    with pytest.raises(ConfigError, match="RUNLOG_KAFKA_SSL_KEY_PASSWORD"):
        ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_certificate_location=str(files["client"]),
                          ssl_key_location=str(files["client_key_enc"]), ssl_key_password="wrong"))


def test_pkcs12_keystore(pki: Pki, files: dict[str, Path], mtls: TlsServer) -> None:
    ctx = ssl_context(extra(ssl_ca_pem=pki.ca_pem, ssl_keystore_location=str(files["p12"]),
                            ssl_keystore_password="store-pass"))
    assert mtls.handshake(ctx) == b"ok"
    assert mtls.peers[-1] == "projector-client"


def test_without_the_client_certificate_mtls_fails(pki: Pki, mtls: TlsServer) -> None:
    with pytest.raises((ssl.SSLError, OSError)):
        mtls.handshake(ssl_context(extra(ssl_ca_pem=pki.ca_pem)))
        mtls.handshake(ssl_context(extra(ssl_ca_pem=pki.ca_pem)))  # TLS 1.3 reports it on first read


def test_a_key_without_its_certificate_is_refused(pki: Pki) -> None:
    with pytest.raises(ConfigError, match="without its certificate"):
        ssl_context(extra(ssl_key_pem=pki.client_key_pem))


# -- SASL -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
@pytest.mark.parametrize("protocol", ["SASL_SSL", "SASL_PLAINTEXT"])
def test_sasl_mechanisms(mechanism: str, protocol: str, pki: Pki) -> None:
    creds = broker_credentials(extra(security_protocol=protocol, sasl_mechanism=mechanism,
                                     sasl_username="svc", sasl_password="pw", ssl_ca_pem=pki.ca_pem))
    assert isinstance(creds, faust.SASLCredentials)
    assert (creds.username, creds.password, creds.mechanism.value) == ("svc", "pw", mechanism)
    assert creds.protocol.value == protocol
    if protocol == "SASL_SSL":
        assert isinstance(creds.ssl_context, ssl.SSLContext)
        assert len(creds.ssl_context.get_ca_certs()) == 1
    else:
        assert creds.ssl_context is None


def test_sasl_mechanisms_alias_and_case() -> None:
    creds = broker_credentials({"security.protocol": "sasl_plaintext", "sasl.mechanisms": "scram-sha-256",
                                "sasl.username": "u", "sasl.password": "p"})
    assert creds.mechanism.value == "SCRAM-SHA-256"


def test_secrets_stay_out_of_the_credentials_repr(pki: Pki) -> None:
    creds = broker_credentials(extra(security_protocol="SASL_SSL", sasl_mechanism="PLAIN",
                                     sasl_username="svc", sasl_password="hunter2", ssl_ca_pem=pki.ca_pem))
    assert "hunter2" not in repr(creds)


class TokenEndpoint:
    """An OAuth token endpoint on loopback that records requests and hands out JWT-shaped tokens."""

    def __init__(self, lifetime: int = 3600) -> None:
        self.requests: list[dict[str, Any]] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"])).decode()
                outer.requests.append({"auth": self.headers["Authorization"],
                                       "form": dict(urllib.parse.parse_qsl(body)),
                                       "type": self.headers["Content-Type"]})
                claims = {"sub": "projector", "exp": int(time.time()) + lifetime}
                seg = base64.urlsafe_b64encode(json.dumps(claims).encode()).rstrip(b"=").decode()
                token = f"eyJhbGciOiJub25lIn0.{seg}.sig{len(outer.requests)}"
                data = json.dumps({"access_token": token, "token_type": "bearer"}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/token"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def test_oauthbearer_oidc_client_credentials(pki: Pki) -> None:
    ep = TokenEndpoint()
    try:
        creds = broker_credentials(extra(
            security_protocol="SASL_SSL", sasl_mechanism="OAUTHBEARER", sasl_oauthbearer_method="oidc",
            sasl_oauthbearer_client_id="runlog", sasl_oauthbearer_client_secret="s3cr3t",
            sasl_oauthbearer_token_endpoint_url=ep.url, sasl_oauthbearer_scope="kafka read",
            sasl_oauthbearer_extensions="logicalCluster=lkc-1,identityPoolId=pool-2", ssl_ca_pem=pki.ca_pem))
        assert isinstance(creds, faust.OAuthCredentials)
        assert creds.protocol.value == "SASL_SSL" and creds.mechanism.value == "OAUTHBEARER"
        provider = creds.oauth_cb
        assert isinstance(provider, OidcTokenProvider)
        assert provider.extensions() == {"logicalCluster": "lkc-1", "identityPoolId": "pool-2"}
        import asyncio

        first = asyncio.run(provider.token())
        assert first.endswith(".sig1") and asyncio.run(provider.token()) == first  # reused until 80%
        (req,) = ep.requests
        assert req["auth"] == "Basic " + base64.b64encode(b"runlog:s3cr3t").decode()
        assert req["form"] == {"grant_type": "client_credentials", "scope": "kafka read"}
        assert req["type"] == "application/x-www-form-urlencoded"
        assert "s3cr3t" not in repr(provider) and "s3cr3t" not in repr(creds)
    finally:
        ep.close()


def test_oauthbearer_token_is_refreshed_when_due() -> None:
    ep = TokenEndpoint(lifetime=1)
    try:
        p = OidcTokenProvider(ep.url, "id", "secret")
        a = p.token_now()
        time.sleep(1.1)
        assert p.token_now() != a and len(ep.requests) == 2
    finally:
        ep.close()


# -- refusals ---------------------------------------------------------------------------------------

_OAUTH = {"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}
_OIDC = {**_OAUTH, "sasl.oauthbearer.method": "oidc"}


@pytest.mark.parametrize(
    ("settings", "named"),
    [
        ({"security.protocol": "KERBEROS"}, "RUNLOG_KAFKA_SECURITY_PROTOCOL"),
        ({"security.protocol": "SASL_SSL"}, "RUNLOG_KAFKA_SASL_MECHANISM"),  # librdkafka: GSSAPI
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "GSSAPI"}, "RUNLOG_KAFKA_SASL_MECHANISM"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
          "sasl.kerberos.keytab": "/etc/k.tab"}, "RUNLOG_KAFKA_SASL_KERBEROS_KEYTAB"),
        ({"security.protocol": "SSL", "ssl.curves.list": "P-256:X25519"}, "RUNLOG_KAFKA_SSL_CURVES_LIST"),
        ({"security.protocol": "SSL", "ssl.sigalgs.list": "RSA+SHA256"}, "RUNLOG_KAFKA_SSL_SIGALGS_LIST"),
        ({"security.protocol": "SSL", "ssl.engine.location": "/x.so"}, "RUNLOG_KAFKA_SSL_ENGINE_LOCATION"),
        ({"security.protocol": "SSL", "ssl.providers": "legacy"}, "RUNLOG_KAFKA_SSL_PROVIDERS"),
        ({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": "dns"},
         "RUNLOG_KAFKA_SSL_ENDPOINT_IDENTIFICATION_ALGORITHM"),
        ({"security.protocol": "SSL", "enable.ssl.certificate.verification": "maybe"},
         "RUNLOG_KAFKA_ENABLE_SSL_CERTIFICATE_VERIFICATION"),
        (_OAUTH, "RUNLOG_KAFKA_SASL_OAUTHBEARER_METHOD"),
        ({**_OAUTH, "enable.sasl.oauthbearer.unsecure.jwt": "true"},
         "RUNLOG_KAFKA_ENABLE_SASL_OAUTHBEARER_UNSECURE_JWT"),
        ({**_OIDC, "sasl.oauthbearer.grant.type": "urn:ietf:params:oauth:grant-type:jwt-bearer"},
         "RUNLOG_KAFKA_SASL_OAUTHBEARER_GRANT_TYPE"),
        (_OIDC, "RUNLOG_KAFKA_SASL_OAUTHBEARER_TOKEN_ENDPOINT_URL"),
        ({"some.future.setting": "1"}, "RUNLOG_KAFKA_SOME_FUTURE_SETTING"),
        ({"group.instance.id": "static-1"}, "RUNLOG_KAFKA_GROUP_INSTANCE_ID"),
    ],
)
def test_refusal_names_the_setting(settings: dict[str, str], named: str) -> None:
    s = Settings.from_env({}, kafka_extra=settings)
    with pytest.raises(ConfigError) as err:
        faust_settings(s, ProjectorOptions())
    assert named in str(err.value)


def test_refusal_is_raised_even_over_plaintext() -> None:
    with pytest.raises(ConfigError, match=r"RUNLOG_KAFKA_SSL_CURVES_LIST \(ssl.curves.list\)"):
        broker_credentials({"ssl.curves.list": "P-256"})


def test_non_security_tunables_are_accepted_and_not_passed() -> None:
    s = Settings.from_env({"RUNLOG_KAFKA_LINGER_MS": "20", "RUNLOG_KAFKA_FETCH_MAX_BYTES": "1000000",
                           "RUNLOG_KAFKA_SOCKET_KEEPALIVE_ENABLE": "true", "RUNLOG_KAFKA_DEBUG": "broker"})
    assert faust_credentials(s) is None
    assert "broker_credentials" not in faust_settings(s, ProjectorOptions())


def test_the_key_lists_are_disjoint_and_the_allow_list_holds_no_security_key() -> None:
    assert not (HONOURED & NOT_SECURITY) and not (HONOURED & REFUSED.keys())
    assert not (NOT_SECURITY & REFUSED.keys())
    for key in NOT_SECURITY:
        assert not any(word in key for word in ("ssl", "sasl", "security", "oauth", "kerberos", "keystore",
                                                 "cert", "password")), key


def test_metrics_endpoints_listen_on_loopback_unless_a_host_is_set() -> None:
    import urllib.request

    from prometheus_client import CollectorRegistry

    from runlog.processors.metrics import MetricsServer

    assert Settings.from_env({}).metrics_host == "127.0.0.1"
    s = Settings.from_env({"RUNLOG_METRICS_HOST": "0.0.0.0"})
    assert s.metrics_host == "0.0.0.0" and s.to_env()["RUNLOG_METRICS_HOST"] == "0.0.0.0"
    server = MetricsServer(CollectorRegistry(), 0)
    try:
        assert server._server.server_address[0] == "127.0.0.1"
        assert urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=5).status == 200
    finally:
        server.close()
    server = MetricsServer(CollectorRegistry(), 0, s.metrics_host)
    try:
        assert server._server.server_address[0] == "0.0.0.0"
    finally:
        server.close()


def test_the_projector_takes_static_membership_and_its_session_timeout() -> None:
    from runlog.processors.projector import ProjectorOptions, faust_settings

    opts = ProjectorOptions(session_timeout_ms=6000, instance_id="pod-1")
    conf = faust_settings(Settings.from_env({}), opts)
    assert conf["broker_session_timeout"] == 6.0 and conf["broker_heartbeat_interval"] == 2.0
    assert conf["consumer_group_instance_id"] == "pod-1"
    assert "consumer_group_instance_id" not in faust_settings(Settings.from_env({}), ProjectorOptions())
