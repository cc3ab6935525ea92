"""Helpers shared by the infrastructure and cluster fault tests."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

from producers import RunWriter
from producers._writer import DeliveryCallback
from projections.rebuild import _consumer, _read, _watermarks
from schemas import Codec, DeliveryError, RunEvent, Settings, Topics

ROOT = Path(__file__).resolve().parents[2]


def local(cmd: str, local_dir: Path, *args: str, **env: str) -> str:
    """Run a ``deploy/local`` script against private services (never the shared ones)."""
    full = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    full.update({"RUNLOG_LOCAL_DIR": str(local_dir), **env})
    proc = subprocess.run([str(ROOT / "deploy" / "local" / cmd), *args], env=full, capture_output=True,
                          text=True, timeout=180, check=False)
    assert proc.returncode == 0, f"deploy/local/{cmd} {' '.join(args)} failed: {proc.stderr[-2000:]}"
    return proc.stdout


def link_jar_cache(local_dir: Path) -> None:
    """Link the repo's Kafka jar cache into a private ``RUNLOG_LOCAL_DIR``, so nothing is fetched."""
    (local_dir / "kafka").mkdir(parents=True, exist_ok=True)
    libs = ROOT / ".runlog" / "kafka" / "libs"
    if libs.is_dir() and not (local_dir / "kafka" / "libs").exists():
        (local_dir / "kafka" / "libs").symlink_to(libs)


class AckLog(RunWriter):
    """A run writer that records, per produced event (run id, seq), when it was produced and when the
    broker acknowledged it, and every delivery error."""

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.lock = threading.Lock()
        self.produced: dict[tuple[str, int], float] = {}
        self.acked: dict[tuple[str, int], float] = {}
        self.errors: list[tuple[str, int, str]] = []

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback) -> None:
        key = (event.run_id, event.seq)

        def cb(err: DeliveryError | None, partition: int, offset: int) -> None:
            with self.lock:
                if err is None:
                    self.acked[key] = time.monotonic()
                else:
                    self.errors.append((key[0], key[1], str(err)))
            on_delivery(err, partition, offset)

        with self.lock:
            self.produced[key] = time.monotonic()
        super().produce(event, cb)

    def acked_seqs(self, run_id: str) -> list[int]:
        with self.lock:
            return sorted(s for r, s in self.acked if r == run_id)


def topic_events(settings: Settings) -> list[RunEvent]:
    """Every decodable event on the events topic, partition by partition in log order."""
    codec = Codec(max_record_bytes=settings.max_record_bytes)
    topic = Topics.of(settings).events
    c = _consumer(settings)
    try:
        marks = _watermarks(c, topic)
        out: list[RunEvent] = []
        for batch in _read(c, topic, {p: lo for p, (lo, _) in marks.items()},
                           {p: hi for p, (_, hi) in marks.items()}):
            out.extend(codec.decode(m.value(), RunEvent) for m in batch)
        return out
    finally:
        c.close()
