"""The demo's outside world: real local HTTP services with their own SQLite storage.

Four systems, each with its own database file, so double execution is visible
and countable:

* ``search``   results change on every call (a drifting index); counts calls.
* ``renderer`` renders an image from a prompt and a seed and bills it into its
  own ledger; a repeated idempotency key returns the first render unbilled (a
  call without a key is billed every time).
* ``assets``   stores uploads keyed by the caller's idempotency key: the same
  key returns the stored asset instead of a second one.
* ``platform`` publishes articles. It does NOT deduplicate: a blind retry
  publishes twice. Articles can be looked up by delivery key or content hash,
  which is what reconciliation asks.
* ``payments`` charges a card; no idempotency at all.

Run it with ``python -m runlog.processors.demo.world --dir DIR --port PORT``; ``/stats``
returns every counter as JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Callable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["World", "serve"]

_SCHEMAS = {
    "search": "CREATE TABLE IF NOT EXISTS calls (id INTEGER PRIMARY KEY, query TEXT, at REAL)",
    "renderer": "CREATE TABLE IF NOT EXISTS bills (id INTEGER PRIMARY KEY, prompt TEXT, seed INTEGER,"
    " idempotency_key TEXT, sha256 TEXT, cents INTEGER)",
    "assets": "CREATE TABLE IF NOT EXISTS assets (idempotency_key TEXT PRIMARY KEY, sha256 TEXT,"
    " size INTEGER, asset_id TEXT); CREATE TABLE IF NOT EXISTS uploads (id INTEGER PRIMARY KEY,"
    " idempotency_key TEXT, created INTEGER)",
    "platform": "CREATE TABLE IF NOT EXISTS articles (id INTEGER PRIMARY KEY, delivery_key TEXT,"
    " title TEXT, content_hash TEXT, body TEXT, account TEXT, fencing_epoch INTEGER)",
    "payments": "CREATE TABLE IF NOT EXISTS charges (id INTEGER PRIMARY KEY, account TEXT,"
    " cents INTEGER, reference TEXT)",
}


def _private(path: Path) -> Path:
    """``path``, created empty and owner-only (0600) when it does not exist yet, made 0600 if it does."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT, 0o600))
    path.chmod(0o600)
    return path


class World:
    """The storage and behaviour of the demo's external systems (one SQLite file each)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        root.chmod(0o700)  # owner only (mkdir's mode is masked by the umask): prompts, bills, articles
        ident = root / "account"
        if not ident.exists():
            _private(ident).write_text(f"acct-{uuid.uuid4().hex[:12]}")
        self.account = ident.read_text().strip()
        """The account this world's services hold (its own tenant): part of every delivery key, so
        two worlds are two environments and the same object delivered to both is two effects."""
        self._lock = threading.Lock()
        self._db: dict[str, sqlite3.Connection] = {}
        for name, ddl in _SCHEMAS.items():
            # SQLite gives the -wal and -shm files the database file's mode: 0600 for all three
            conn = sqlite3.connect(_private(root / f"{name}.db"), check_same_thread=False,
                                   isolation_level=None)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(ddl)
            self._db[name] = conn

    def _one(self, db: str, sql: str, args: tuple[Any, ...] = ()) -> Any:
        row = self._db[db].execute(sql, args).fetchone()
        return None if row is None else row[0]

    def search(self, query: str) -> dict[str, Any]:
        with self._lock:
            cur = self._db["search"].execute("INSERT INTO calls (query, at) VALUES (?, 0)", (query,))
            n = int(cur.lastrowid or 0)
        # the index drifts: every call sees a different ranking and a fresh result
        results = [
            {"title": f"{query}: source {(n * 7 + i) % 23}", "rank": i, "index_version": n}
            for i in range(5)
        ]
        return {"query": query, "results": results, "index_version": n}

    def render(self, prompt: str, seed: int, idempotency_key: str | None) -> dict[str, Any]:
        image = hashlib.sha256(f"{prompt}|{seed}".encode()).digest() * 64  # 2 KiB "image"
        digest = hashlib.sha256(image).hexdigest()
        with self._lock:
            if idempotency_key is not None:
                row = self._db["renderer"].execute(
                    "SELECT id FROM bills WHERE idempotency_key = ? ORDER BY id LIMIT 1",
                    (idempotency_key,)).fetchone()
                if row is not None:
                    return {"render_id": f"r-{row[0]}", "sha256": digest, "image_hex": image.hex(),
                            "watermark": False, "billed_cents": 0}
            cur = self._db["renderer"].execute(
                "INSERT INTO bills (prompt, seed, idempotency_key, sha256, cents) VALUES (?,?,?,?,?)",
                (prompt, seed, idempotency_key, digest, 4),
            )
        return {"render_id": f"r-{cur.lastrowid}", "sha256": digest, "image_hex": image.hex(),
                "watermark": False, "billed_cents": 4}

    def upload(self, idempotency_key: str, data: bytes) -> dict[str, Any]:
        digest = hashlib.sha256(data).hexdigest()
        with self._lock:
            db = self._db["assets"]
            row = db.execute("SELECT asset_id, sha256 FROM assets WHERE idempotency_key = ?",
                             (idempotency_key,)).fetchone()
            created = row is None
            if created:
                asset_id = f"asset-{digest[:12]}-{self._one('assets', 'SELECT COUNT(*) FROM assets')}"
                db.execute("INSERT INTO assets VALUES (?,?,?,?)",
                           (idempotency_key, digest, len(data), asset_id))
            else:
                asset_id = row[0]
            db.execute("INSERT INTO uploads (idempotency_key, created) VALUES (?, ?)",
                       (idempotency_key, int(created)))
        return {"asset_id": asset_id, "sha256": digest, "created": created}

    def publish(self, article: dict[str, Any]) -> dict[str, Any]:
        with self._lock:
            cur = self._db["platform"].execute(
                "INSERT INTO articles (delivery_key, title, content_hash, body, account, fencing_epoch)"
                " VALUES (?,?,?,?,?,?)",
                (article.get("delivery_key"), article["title"], article["content_hash"],
                 article["body"], article.get("account", ""), article.get("fencing_epoch")),
            )
        return {"article_id": f"art-{cur.lastrowid}", "url": f"/articles/{cur.lastrowid}"}

    def find_articles(self, delivery_key: str | None, content_hash: str | None) -> list[dict[str, Any]]:
        sql = "SELECT id, delivery_key, title, content_hash FROM articles WHERE "
        if delivery_key is not None:
            rows = self._db["platform"].execute(sql + "delivery_key = ?", (delivery_key,)).fetchall()
        else:
            rows = self._db["platform"].execute(sql + "content_hash = ?", (content_hash,)).fetchall()
        return [{"article_id": f"art-{r[0]}", "delivery_key": r[1], "title": r[2],
                 "content_hash": r[3]} for r in rows]

    def charge(self, account: str, cents: int, reference: str) -> dict[str, Any]:
        with self._lock:
            cur = self._db["payments"].execute(
                "INSERT INTO charges (account, cents, reference) VALUES (?,?,?)",
                (account, cents, reference))
        return {"charge_id": f"ch-{cur.lastrowid}"}

    def stats(self) -> dict[str, int]:
        return {
            "research_calls": int(self._one("search", "SELECT COUNT(*) FROM calls")),
            "renders_billed": int(self._one("renderer", "SELECT COUNT(*) FROM bills")),
            "render_cents": int(self._one("renderer", "SELECT COALESCE(SUM(cents),0) FROM bills")),
            "uploads": int(self._one("assets", "SELECT COUNT(*) FROM uploads")),
            "assets": int(self._one("assets", "SELECT COUNT(*) FROM assets")),
            "publishes": int(self._one("platform", "SELECT COUNT(*) FROM articles")),
            "charges": int(self._one("payments", "SELECT COUNT(*) FROM charges")),
            "charged_references": int(self._one("payments", "SELECT COUNT(DISTINCT reference) FROM charges")),
        }


def _handler(world: World) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "runlog-demo-world/1"

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

        def _send(self, code: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> bytes:
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            if url.path == "/stats":
                self._send(200, world.stats())
            elif url.path == "/articles":
                self._send(200, world.find_articles(q.get("delivery_key"), q.get("content_hash")))
            elif url.path == "/health":
                self._send(200, {"ok": True, "account": world.account})
            else:
                self._send(404, {"error": "not found"})

        def do_POST(self) -> None:
            url = urlsplit(self.path)
            routes: dict[str, Callable[[], Any]] = {
                "/search": lambda: world.search(self._json()["query"]),
                "/render": lambda: (lambda j: world.render(j["prompt"], int(j["seed"]),
                                                           j.get("idempotency_key")))(self._json()),
                "/articles": lambda: world.publish(self._json()),
                "/charges": lambda: (lambda j: world.charge(j["account"], int(j["cents"]),
                                                            j["reference"]))(self._json()),
            }
            if url.path.startswith("/assets/"):
                self._send(200, world.upload(url.path[len("/assets/"):], self._body()))
            elif url.path in routes:
                try:
                    self._send(200, routes[url.path]())
                except (KeyError, ValueError, json.JSONDecodeError) as err:
                    self._send(HTTPStatus.BAD_REQUEST, {"error": f"bad request: {err}"})
            else:
                self._send(404, {"error": "not found"})

        def _json(self) -> dict[str, Any]:
            doc = json.loads(self._body() or b"{}")
            if not isinstance(doc, dict):
                raise ValueError("body must be a JSON object")
            return doc

    return Handler


class WorldServer(ThreadingHTTPServer):
    """The world's HTTP server: a listen backlog for many concurrent runs (the default is 5, and a
    full backlog resets connections, which a client sees as a failed call)."""

    request_queue_size = 256
    daemon_threads = True


def serve(root: Path, port: int = 0) -> ThreadingHTTPServer:
    """Start the world's HTTP server on 127.0.0.1 in a daemon thread; returns the server."""
    server = WorldServer(("127.0.0.1", port), _handler(World(root)))
    threading.Thread(target=server.serve_forever, name="demo-world", daemon=True).start()
    return server


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("--dir", type=Path, required=True)
    p.add_argument("--port", type=int, default=0)
    a = p.parse_args()
    server = WorldServer(("127.0.0.1", a.port), _handler(World(a.dir)))
    print(f"http://127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
