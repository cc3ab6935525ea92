"""A small Chrome DevTools Protocol driver for the console's browser test (no browser download).

It starts the system's ``chromium`` headless with a private profile and a debugging port,
attaches to its page over the DevTools websocket (aiohttp's client) and offers what the test
needs: navigate, evaluate, wait for a condition, click at an element's position with real
mouse events, type with real key input.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, BinaryIO

import aiohttp

__all__ = ["Browser", "BrowserError", "chromium_path"]


class BrowserError(AssertionError):
    """The page did not do what the test waited for, or DevTools answered with an error."""


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Browser:
    """One headless Chromium with one page, driven over DevTools."""

    def __init__(self, binary: str, profile: Path) -> None:
        self.binary = binary
        self.profile = profile
        self.proc: subprocess.Popen[bytes] | None = None
        self._log: BinaryIO | None = None
        self.http: aiohttp.ClientSession | None = None
        self.ws: aiohttp.ClientWebSocketResponse | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[Any]] = {}
        self._reader: asyncio.Task[None] | None = None
        self.console_messages: list[str] = []

    async def __aenter__(self) -> Browser:
        self.profile.mkdir(parents=True, exist_ok=True)
        self._log = (self.profile / "chromium.log").open("wb")
        self.proc = subprocess.Popen(
            [self.binary, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-dev-shm-usage", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
             f"--user-data-dir={self.profile}", "about:blank"],
            stdout=subprocess.DEVNULL, stderr=self._log)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise BrowserError(f"chromium did not open its DevTools port: "
                                   f"{(self.profile / 'chromium.log').read_text()[-2000:]}")
            await asyncio.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        self.http = aiohttp.ClientSession()
        targets: list[dict[str, Any]] = []
        while not any(t.get("type") == "page" for t in targets):
            async with self.http.get(f"http://127.0.0.1:{port}/json/list") as r:
                targets = await r.json()
            await asyncio.sleep(0.05)
        page = next(t for t in targets if t.get("type") == "page")
        self.ws = await self.http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read())
        await self.send("Page.enable")
        await self.send("Runtime.enable")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self.ws is not None:
            await self.ws.close()
        if self.http is not None:
            await self.http.close()
        if self.proc is not None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        if self._log is not None:
            self._log.close()

    async def _read(self) -> None:
        assert self.ws is not None
        async for msg in self.ws:
            if msg.type is not aiohttp.WSMsgType.TEXT:
                continue
            doc = json.loads(msg.data)
            fut = self._pending.pop(doc.get("id", -1), None)
            if fut is not None and not fut.done():
                fut.set_result(doc)
            elif doc.get("method") == "Runtime.consoleAPICalled":
                args = doc["params"].get("args", [])
                text = " ".join(str(a.get("value", a.get("description"))) for a in args)
                self.console_messages.append(text)
            elif doc.get("method") == "Runtime.exceptionThrown":
                self.console_messages.append(json.dumps(doc["params"]["exceptionDetails"])[:500])

    async def send(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30) -> Any:
        assert self.ws is not None
        i = next(self._ids)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._pending[i] = fut
        await self.ws.send_str(json.dumps({"id": i, "method": method, "params": params or {}}))
        doc = await asyncio.wait_for(fut, timeout)
        if "error" in doc:
            raise BrowserError(f"{method}: {doc['error']}")
        return doc.get("result", {})

    async def evaluate(self, expression: str) -> Any:
        res = await self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                   "awaitPromise": True})
        if "exceptionDetails" in res:
            raise BrowserError(f"{expression!r} threw: {res['exceptionDetails']}")
        return res["result"].get("value")

    async def navigate(self, url: str) -> None:
        await self.send("Page.navigate", {"url": url})
        await self.wait_for(f"document.readyState === 'complete' && location.href === {json.dumps(url)}",
                            what=f"{url} to load")

    async def wait_for(self, expression: str, *, timeout: float = 30, what: str = "") -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                body = await self.evaluate("document.body ? document.body.innerText.slice(0, 3000) : ''")
                raise BrowserError(f"timed out waiting for {what or expression}; page text:\n{body}\n"
                                   f"console: {self.console_messages[-10:]}")
            await asyncio.sleep(0.1)

    async def click(self, selector: str) -> None:
        """A left click at the element's centre, with the mouse (as a person clicks)."""
        box = await self.evaluate(
            f"(() => {{ const el = document.querySelector({json.dumps(selector)}); if (!el) return null;"
            " el.scrollIntoView({block: 'center'}); const r = el.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; })()")
        if box is None:
            raise BrowserError(f"no element {selector!r} to click")
        x, y = box
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            await self.send("Input.dispatchMouseEvent", {"type": kind, "x": x, "y": y, "button": "left",
                                                         "clickCount": 0 if kind == "mouseMoved" else 1})

    async def type(self, selector: str, text: str) -> None:
        """Click into the field and type ``text`` (replacing what it held)."""
        await self.click(selector)
        await self.evaluate(f"document.querySelector({json.dumps(selector)}).select()")
        await self.send("Input.insertText", {"text": text})
