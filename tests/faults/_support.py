"""Helpers shared by the infrastructure and cluster fault tests."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

from runlog.producers import CallInfo, StageContext, Workflow, rule, tool
from runlog.producers.log._writer import DeliveryCallback, RunWriter
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, DeliveryError, ReplayPolicy, RunEvent, RunlogError, Settings
from runlog.schemas._tracecontext import TraceContext

ROOT = Path(__file__).resolve().parents[2]


def local(cmd: str, local_dir: Path, *args: str, check: bool = True, **env: str) -> str:
    """Run a ``deploy/local`` script against private services (never the shared ones); with
    ``check``, a failure fails the test."""
    full = {k: v for k, v in os.environ.items() if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")}
    full.update({"RUNLOG_LOCAL_DIR": str(local_dir), **env})
    proc = subprocess.run([str(ROOT / "deploy" / "local" / cmd), *args], env=full, capture_output=True,
                          text=True, timeout=180, check=False)
    assert not check or proc.returncode == 0, (
        f"deploy/local/{cmd} {' '.join(args)} failed: {proc.stderr[-2000:]}")
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

    def produce(self, event: RunEvent, on_delivery: DeliveryCallback,
                trace: TraceContext | None = None) -> str:
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
        return super().produce(event, cb, trace)

    def acked_seqs(self, run_id: str) -> list[int]:
        with self.lock:
            return sorted(s for r, s in self.acked if r == run_id)


def topic_events(settings: Settings, attempts: int = 5) -> list[RunEvent]:
    """Every decodable event on the events topic, partition by partition in log order (retried: right
    after a broker died, a read can fail while the client drops the dead broker's handle)."""
    for attempt in range(attempts):
        try:
            return _topic_events(settings)
        except RunlogError:
            if attempt == attempts - 1:
                raise
            time.sleep(2.0)
    raise AssertionError("unreachable")


def _topic_events(settings: Settings) -> list[RunEvent]:
    codec = Codec(max_record_bytes=settings.max_record_bytes)
    return [codec.decode(m.value(), RunEvent) for batch in read_topic(settings) for m in batch]


def busy_workflow(calls: int, pause_s: float) -> Workflow:
    """Three stages of ``calls`` SAFE tool calls each, every call sleeping ``pause_s``."""
    @tool("tick", policy=ReplayPolicy.SAFE)
    def tick(call: CallInfo, n: int) -> Any:
        time.sleep(pause_s)
        return {"n": n}

    wf = Workflow("busy", version="1")
    for name in ("one", "two", "three"):
        @wf.stage(name, rules=[rule("ticks.all", lambda out: len(out["ticks"]) == calls)])
        def stage(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
            return {"ticks": [ctx.call(tick, n=i)["n"] for i in range(calls)]}
    return wf
