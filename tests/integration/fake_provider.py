"""A fake model provider on 127.0.0.1 with its own counters, for the rate-limit tests: a bucket of
``requests`` and ``tokens`` refilled continuously over ``per_s``; a completion past it is answered 429
with ``Retry-After``. It also applies effects idempotently (``POST /v1/effects`` with a key: applied
once, a repeat counted as a repeat), so a test can tell an effect applied twice.

In a test's process (:class:`Provider`), or a process of its own::

    python -m tests.integration.fake_provider --port 22xxx --requests 600 --tokens 100000 --per 60

``GET /stats`` answers its counters (JSON); ``GET /log`` every served completion and applied effect
(time, tokens, tenant, run).
"""

from __future__ import annotations

import argparse
import json
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from runlog.producers import RateLimited

__all__ = ["Provider", "ask", "effect", "stats"]


class Provider:
    """The provider (the module docstring); ``port`` 0: any free port."""

    def __init__(self, requests: int, tokens: int, per_s: float, *, port: int = 0) -> None:
        self.caps, self.per_s = (float(requests), float(tokens)), per_s
        self.level = list(self.caps)
        self.at = time.monotonic()
        self.served = 0
        self.refused = 0
        self.tokens = 0
        self.served_log: list[tuple[float, int, str, str]] = []
        """(wall time, tokens, tenant, run) of each completion served."""
        self.effects: dict[str, int] = {}
        """effect key -> times asked (applied once)."""
        self.effect_log: list[tuple[float, str, str]] = []
        """(wall time, tenant, run) of each effect applied."""
        self.lock = threading.Lock()
        provider = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if self.path == "/v1/effects":
                    code, doc = provider.apply(str(body["key"]), str(body.get("tenant", "")),
                                               str(body.get("run", "")))
                else:
                    code, doc = provider.answer(int(body["tokens"]), str(body.get("tenant", "")),
                                                str(body.get("run", "")))
                self._send(code, doc)

            def do_GET(self) -> None:
                self._send(200, provider.stats() if self.path == "/stats" else provider.log())

            def _send(self, code: int, doc: dict[str, Any]) -> None:
                data = json.dumps(doc).encode()
                self.send_response(code)
                if code == 429:
                    self.send_header("Retry-After", str(doc["retry_after"]))
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: Any) -> None:
                pass

        ThreadingHTTPServer.request_queue_size = 256
        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.url = f"{self.base}/v1/complete"

    def answer(self, tokens: int, tenant: str = "", run: str = "") -> tuple[int, dict[str, Any]]:
        with self.lock:
            now = time.monotonic()
            for i, cap in enumerate(self.caps):
                self.level[i] = min(cap, self.level[i] + (now - self.at) * cap / self.per_s)
            self.at = now
            if self.level[0] < 1 or self.level[1] < tokens:
                self.refused += 1
                return 429, {"retry_after": 1}
            self.level[0] -= 1
            self.level[1] -= tokens
            self.served += 1
            self.tokens += tokens
            self.served_log.append((time.time(), tokens, tenant, run))
            half = tokens // 2
            return 200, {"text": "ok", "usage": {"input_tokens": half, "output_tokens": tokens - half}}

    def apply(self, key: str, tenant: str, run: str) -> tuple[int, dict[str, Any]]:
        with self.lock:
            n = self.effects.get(key, 0)
            self.effects[key] = n + 1
            if n == 0:
                self.effect_log.append((time.time(), tenant, run))
            return 200, {"external_id": f"fx-{key[:16]}", "repeat": n > 0}

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {"served": self.served, "refused": self.refused, "tokens": self.tokens,
                    "effects": len(self.effects), "effect_repeats": sum(n - 1 for n in self.effects.values()),
                    "requests_limit": self.caps[0], "tokens_limit": self.caps[1], "per_s": self.per_s}

    def log(self) -> dict[str, Any]:
        with self.lock:
            return {"served": list(self.served_log), "effects": list(self.effect_log)}

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _post(url: str, doc: dict[str, Any]) -> dict[str, Any]:
    req = urllib.request.Request(url, data=json.dumps(doc).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            out: dict[str, Any] = json.loads(resp.read())
            return out
    except urllib.error.HTTPError as err:
        err.close()
        if err.code == 429:
            after = float(err.headers["Retry-After"])
            raise RateLimited("429 from the provider", retry_after_s=after) from None
        raise


def ask(url: str, tokens: int, tenant: str = "", run: str = "") -> dict[str, Any]:
    """One completion of ``tokens`` (a 429 raises :class:`~runlog.producers.RateLimited`)."""
    return _post(url, {"tokens": tokens, "tenant": tenant, "run": run})


def effect(base: str, key: str, tenant: str = "", run: str = "") -> dict[str, Any]:
    """Apply the effect ``key`` (idempotent: a repeat applies nothing and is counted)."""
    return _post(f"{base}/v1/effects", {"key": key, "tenant": tenant, "run": run})


def stats(base: str, what: str = "stats") -> dict[str, Any]:
    with urllib.request.urlopen(f"{base}/{what}", timeout=30) as resp:
        out: dict[str, Any] = json.loads(resp.read())
        return out


def main() -> None:
    p = argparse.ArgumentParser(description="a fake model provider with its own limits and counters")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--requests", type=int, default=600)
    p.add_argument("--tokens", type=int, default=100_000)
    p.add_argument("--per", type=float, default=60.0)
    a = p.parse_args()
    provider = Provider(a.requests, a.tokens, a.per, port=a.port)
    print(f"provider on {provider.base}", flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        provider.close()


if __name__ == "__main__":
    main()
