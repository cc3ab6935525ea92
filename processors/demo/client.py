"""A small JSON-over-HTTP client for the demo world (standard library only)."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from typing import Any

from runlog.schemas.errors import RetryableToolError, TerminalToolError

__all__ = ["WorldClient"]


class WorldClient:
    """Talks to the demo world's services at ``base_url``."""

    def __init__(self, base_url: str, timeout: float = 10.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    def _call(self, method: str, path: str, body: bytes | None = None,
              content_type: str = "application/json") -> Any:
        if not self.base_url:
            raise TerminalToolError("the demo world is not configured: set RUNLOG_DEMO_WORLD_URL")
        req = urllib.request.Request(self.base_url + path, data=body, method=method,
                                     headers={"Content-Type": content_type})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                return json.loads(resp.read())
        except urllib.error.HTTPError as err:
            if err.code >= 500:
                raise RetryableToolError(f"{method} {path}: HTTP {err.code}") from err
            raise TerminalToolError(f"{method} {path}: HTTP {err.code} {err.read()[:200]!r}") from err
        except (urllib.error.URLError, TimeoutError, ConnectionError) as err:
            raise RetryableToolError(f"{method} {path}: {err}") from err

    def post(self, path: str, doc: dict[str, Any]) -> Any:
        return self._call("POST", path, json.dumps(doc).encode())

    def get(self, path: str, **query: str) -> Any:
        qs = ("?" + urllib.parse.urlencode(query)) if query else ""
        return self._call("GET", path + qs)

    def upload(self, idempotency_key: str, data: bytes) -> Any:
        return self._call("POST", f"/assets/{urllib.parse.quote(idempotency_key)}", data,
                          "application/octet-stream")

    def account(self) -> str:
        """The account of the world at ``base_url`` (asked once per world)."""
        cache: dict[str, str] = self.__dict__.setdefault("_accounts", {})
        if self.base_url not in cache:
            cache[self.base_url] = str(self.get("/health")["account"])
        return cache[self.base_url]

    def forget(self, base_url: str) -> None:
        """Drop the account cached for ``base_url``: a new world that took a freed port has its own."""
        self.__dict__.get("_accounts", {}).pop(base_url, None)

    def stats(self) -> dict[str, int]:
        result: dict[str, int] = self.get("/stats")
        return result
