"""A client of Toxiproxy's REST API: proxies in front of a service and the toxics (latency, reset,
timeouts) that fault the connections through them. The server is ``toxiproxy-server``, built from its Go
module by ``deploy/local/toxiproxy build``."""

from __future__ import annotations

import contextlib
import json
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from typing import Any

__all__ = ["Toxiproxy", "ToxiproxyError"]


class ToxiproxyError(RuntimeError):
    """The Toxiproxy API refused a request."""


class Toxiproxy:
    """A client of Toxiproxy's REST API (proxies and their toxics)."""

    def __init__(self, url: str) -> None:
        self.url = url.rstrip("/")

    def _call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as err:
            raise ToxiproxyError(f"{method} {path}: {err.code} {err.read()[:300]!r}") from err
        return json.loads(raw) if raw.strip() else None

    def version(self) -> str:
        with urllib.request.urlopen(self.url + "/version", timeout=2) as resp:
            return str(resp.read().decode().strip())

    def create(self, name: str, listen: int, upstream: str) -> None:
        self._call("POST", "/proxies", {"name": name, "listen": f"127.0.0.1:{listen}",
                                        "upstream": upstream, "enabled": True})

    def enable(self, name: str, on: bool) -> None:
        """Disabled: every connection through it is closed and new ones are refused (a partition)."""
        self._call("POST", f"/proxies/{name}", {"enabled": on})

    def add(self, proxy: str, toxic: str, kind: str, stream: str = "downstream", toxicity: float = 1.0,
            **attributes: int) -> None:
        self._call("POST", f"/proxies/{proxy}/toxics", {"name": toxic, "type": kind, "stream": stream,
                                                         "toxicity": toxicity, "attributes": attributes})

    def remove(self, proxy: str, toxic: str) -> None:
        self._call("DELETE", f"/proxies/{proxy}/toxics/{toxic}")

    @contextlib.contextmanager
    def toxic(self, proxy: str, toxic: str, kind: str, **attributes: int) -> Iterator[None]:
        """``toxic`` on ``proxy`` while the block runs (removed however it ends)."""
        self.add(proxy, toxic, kind, "downstream", 1.0, **attributes)
        try:
            yield
        finally:
            self.remove(proxy, toxic)

    @contextlib.contextmanager
    def disabled(self, proxy: str) -> Iterator[None]:
        """``proxy`` disabled (a partition) while the block runs, enabled again however it ends."""
        self.enable(proxy, False)
        try:
            yield
        finally:
            self.enable(proxy, True)

    def toxics(self, proxy: str) -> list[dict[str, Any]]:
        return list(self._call("GET", f"/proxies/{proxy}/toxics"))

    def reset(self) -> None:
        """Every proxy enabled, every toxic removed."""
        self._call("POST", "/reset")
