"""A small local HTTP service implementing the request and response shapes HashiCorp Vault's / OpenBao's
transit engine documents for the endpoints :class:`runlog.producers.internal.TransitKeyProvider` calls.

It is not Vault. The unit tests of the adapter use it (fast, and for the failures a real server is hard
to put in); ``tests/integration/resume/test_transit_vault.py`` runs the adapter against a real Vault server
(``deploy/local/vault``); both pass the same contract test there. It answers ``POST keys/<key>`` (create),
``POST /v1/<mount>/encrypt/<key>``, ``decrypt``, ``GET keys/<key>``,
``POST keys/<key>/rotate``, ``POST keys/<key>/config``; checks ``X-Vault-Token``; keeps a derived key whose
``context`` binds each ciphertext; writes ``vault:v<N>:`` ciphertexts; fails with ``{"errors": [...]}``.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM


class FakeTransit:
    """The service, on 127.0.0.1:``port`` (0: any free port) with one token and one mount."""

    def __init__(self, token: str, *, mount: str = "transit", port: int = 0) -> None:
        self.token = token
        self.mount = mount
        self.keys: dict[str, dict[str, Any]] = {}
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        """(method, path, headers) of every request, for tests that check what was sent."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _reply(self, code: int, doc: dict[str, Any] | None) -> None:
                body = b"" if doc is None else json.dumps(doc).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _handle(self, method: str) -> None:
                fake.requests.append((method, self.path, dict(self.headers)))
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.headers.get("X-Vault-Token") != fake.token:
                    return self._reply(403, {"errors": ["permission denied"]})
                prefix = f"/v1/{fake.mount}/"
                if not self.path.startswith(prefix):
                    return self._reply(404, {"errors": ["no handler for route"]})
                code, doc = fake.route(method, self.path[len(prefix):], body)
                self._reply(code, doc)

            def do_GET(self) -> None:
                self._handle("GET")

            def do_POST(self) -> None:
                self._handle("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.addr = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeTransit:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def create_key(self, name: str) -> None:
        """``POST keys/<name>`` with ``type=aes256-gcm96``, ``derived=true``."""
        self.keys[name] = {"versions": {1: secrets.token_bytes(32)}, "latest": 1, "min_dec": 1}

    def route(self, method: str, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any] | None]:
        parts = path.split("/")
        if method == "POST" and len(parts) == 2 and parts[0] == "keys" and parts[1] not in self.keys:
            if body.get("type", "aes256-gcm96") != "aes256-gcm96" or not body.get("derived"):
                return 400, {"errors": ["this stand-in keeps derived aes256-gcm96 keys only"]}
            self.create_key(parts[1])
            return 204, None
        if len(parts) >= 2 and parts[0] == "keys" and parts[1] in self.keys:
            k = self.keys[parts[1]]
            if method == "GET" and len(parts) == 2:
                return 200, {"data": {"name": parts[1], "type": "aes256-gcm96", "derived": True,
                                      "latest_version": k["latest"], "min_decryption_version": k["min_dec"],
                                      "keys": {str(v): 0 for v in k["versions"]}}}
            if method == "POST" and parts[2:] == ["rotate"]:
                k["latest"] += 1
                k["versions"][k["latest"]] = secrets.token_bytes(32)
                return 204, None
            if method == "POST" and parts[2:] == ["config"]:
                k["min_dec"] = int(body.get("min_decryption_version", k["min_dec"]))
                return 204, None
        if method == "POST" and len(parts) == 2 and parts[0] in ("encrypt", "decrypt"):
            k = self.keys.get(parts[1])
            if k is None:
                return 400, {"errors": ["encryption key not found"]}
            if "context" not in body:
                return 400, {"errors": ["missing 'context' for key derivation; the key was created using a "
                                        "derived key, which means additional, per-request information must "
                                        "be included in order to perform operations with the key"]}
            context = base64.b64decode(body["context"])
            if parts[0] == "encrypt":
                v = k["latest"]
                nonce = secrets.token_bytes(12)
                plain = base64.b64decode(body["plaintext"])
                ct = nonce + self._aead(k, v, context).encrypt(nonce, plain, None)
                return 200, {"data": {"ciphertext": f"vault:v{v}:{base64.b64encode(ct).decode()}",
                                      "key_version": v}}
            _, ver, blob = str(body.get("ciphertext", "")).split(":", 2)
            v = int(ver[1:])
            if v < k["min_dec"] or v not in k["versions"]:
                return 400, {"errors": ["ciphertext version is disallowed by policy (too old)"]}
            raw = base64.b64decode(blob)
            try:
                pt = self._aead(k, v, context).decrypt(raw[:12], raw[12:], None)
            except InvalidTag:
                return 400, {"errors": ["cipher: message authentication failed"]}
            return 200, {"data": {"plaintext": base64.b64encode(pt).decode()}}
        return 404, {"errors": ["no handler for route"]}

    @staticmethod
    def _aead(k: dict[str, Any], version: int, context: bytes) -> AESGCM:
        # a derived key: one AES key per context (the real engine uses HKDF; the shape is what matters)
        return AESGCM(hmac.new(k["versions"][version], context, hashlib.sha256).digest())
