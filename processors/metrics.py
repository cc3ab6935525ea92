"""Prometheus metrics of the projector in the plain-text exposition format, served by a tiny HTTP server."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

__all__ = ["Metrics", "MetricsServer"]

_HELP = {
    "runlog_projector_records_total": ("counter", "Records read from the events topic."),
    "runlog_projector_events_applied_total": ("counter", "Events the fold accepted and Redis stored."),
    "runlog_projector_duplicates_total": ("counter", "Records that were duplicates or redeliveries."),
    "runlog_projector_rejected_total": ("counter", "Events the fold rejected, by reason."),
    "runlog_projector_dead_letters_total": ("counter", "Undecodable records sent to the DLQ, by reason."),
    "runlog_projector_conflicts_total": ("counter", "Run updates re-folded after a stale cache."),
    "runlog_projector_consumer_lag": ("gauge", "High watermark minus next offset to process."),
}


def _labels(labels: Mapping[str, str]) -> str:
    if not labels:
        return ""
    inner = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return "{" + inner + "}"


class Metrics:
    """Thread-safe counters and gauges with labels."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._values: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
        self._gauges: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}

    def inc(self, name: str, value: float = 1, **labels: str) -> None:
        with self._lock:
            key = (name, tuple(sorted(labels.items())))
            self._values[key] = self._values.get(key, 0.0) + value

    def set(self, name: str, value: float, **labels: str) -> None:
        with self._lock:
            self._gauges[(name, tuple(sorted(labels.items())))] = value

    def value(self, name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        with self._lock:
            return self._gauges.get(key, self._values.get(key, 0))

    def render(self) -> str:
        with self._lock:
            rows = list(self._values.items()) + list(self._gauges.items())
        out: list[str] = []
        for name in sorted({n for (n, _), _ in rows} | set(_HELP)):
            kind, text = _HELP.get(name, ("untyped", name))
            out.append(f"# HELP {name} {text}")
            out.append(f"# TYPE {name} {kind}")
            mine = sorted((lbl, v) for (n, lbl), v in rows if n == name)
            if not mine and kind == "counter":
                out.append(f"{name} 0")
            for lbl, v in mine:
                out.append(f"{name}{_labels(dict(lbl))} {v:g}")
        return "\n".join(out) + "\n"


class MetricsServer:
    """Serves ``GET /metrics`` from a daemon thread; ``port=0`` picks a free port."""

    def __init__(self, metrics: Metrics, port: int, host: str = "0.0.0.0") -> None:
        m = metrics

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                body = m.render().encode()
                self.send_response(200 if self.path.startswith("/metrics") else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: object) -> None:
                return

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
