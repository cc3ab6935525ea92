"""Resume benchmarks: plan time against history length, and many crashed runs through the resumer group.

Delivery semantics: histories are written by an idempotent ``acks=all``
producer; their checkpoint snapshots reach Redis through ``runlog.projections.rebuild``
(as after a projector outage); resume requests are consumed at-least-once by
:class:`runlog.processors.resume.ResumerService` members.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from runlog.processors.bench._app import app
from runlog.processors.bench._env import BenchEnv
from runlog.processors.bench._events import CYCLE, history, median, ratio
from runlog.processors.resume import Resumer, ResumerService
from runlog.projections import rebuild
from runlog.schemas import ResumeRequest, now_ms
from runlog.schemas.errors import RunlogError
from runlog.schemas.settings import Settings
from runlog.schemas.topics import Topics

__all__ = ["bench_resume", "bench_resumer_group"]

Tick = Callable[[str], None]
TAIL = 20


def _checkpoint_seq(before: int) -> int:
    """The seq of the last ``VERIFIED`` at or after ``before`` events (VERIFIED is seq 1 + k * CYCLE)."""
    k = max(1, -(-(before - 1) // CYCLE))
    return 1 + k * CYCLE


def _write_and_rebuild(env: BenchEnv, s: Settings, runs: list[tuple[str, int]], *,
                       project: bool = True) -> float:
    """Write each run's first ``n`` events, rebuild them into ``s.redis_prefix``; rebuild events/s.

    With ``project`` false Redis is left empty: resume then folds the run from the log's start.
    """
    events = [e for run, n in runs for e in history(run, 1, n)]
    env.produce_events(s, events)
    if not project:
        t0 = time.perf_counter()
        rep = rebuild(s.with_(redis_prefix=f"{s.redis_prefix}.src"), f"{s.redis_prefix}.measure",
                      progress=None, client=env.redis)
        env.delete_keys(f"{s.redis_prefix}.measure:")
        return rep.records / max(time.perf_counter() - t0, 1e-6)
    rep = rebuild(s.with_(redis_prefix=f"{s.redis_prefix}.src"), s.redis_prefix, progress=None,
                  client=env.redis)
    if rep.applied != len(events):
        raise RunlogError(f"bench: rebuild applied {rep.applied} of {len(events)} events")
    return rep.records / rep.seconds


def bench_resume(env: BenchEnv, *, lengths: list[int], rounds: int, tick: Tick) -> dict[str, Any]:
    """Resume planning (load + tail fold + checks) of runs with ``L`` events before the last checkpoint.

    ``L = 20`` is a run of 20 events in all (no checkpoint); every other ``L`` has
    its last checkpoint after about ``L`` events and ``TAIL`` events after it.
    """
    points: list[dict[str, Any]] = []
    for length in lengths:
        s = env.settings(f"resume{length}")
        run = f"run-h{length}"
        total = TAIL if length <= TAIL else _checkpoint_seq(length) + TAIL
        # The short run is not in Redis: resume folds its 20 events from the log, as the long one
        # folds the 20 after its checkpoint snapshot.
        rate = _write_and_rebuild(env, s, [(run, total)], project=length > TAIL)
        times: list[float] = []
        with Resumer(s, app()) as r:
            for _ in range(rounds):
                t0 = time.perf_counter()
                plan, _state = r.plan(run)
                times.append((time.perf_counter() - t0) * 1000)
            t0 = time.perf_counter()
            out = r.resume(run)
            full_ms = (time.perf_counter() - t0) * 1000
        points.append({"history_events": total - TAIL if length > TAIL else 0, "events": total,
                       "events_read_by_plan": plan.events_read, "plan_ms": median(times),
                       "plan_rounds_ms": times, "resume_ms": full_ms, "resume_result": out.result,
                       "rebuild_events_per_s": rate})
        tick(f"resume: history {length}")
    short, longest = points[0], points[-1]
    return {"resume_tail_ratio": ratio(longest["plan_ms"], short["plan_ms"]),
            "resume_full_ratio": ratio(longest["resume_ms"], short["resume_ms"]), "points": points}


def bench_resumer_group(env: BenchEnv, *, runs: int, members: int, tick: Tick) -> dict[str, Any]:
    """Time to resume ``runs`` crashed runs (each mid-stage after a checkpoint) through the resumer group."""
    s = env.settings("crashed").with_(resumer_group=f"bench-{env.tag}-resumers")
    ids = [f"run-c{i:05d}" for i in range(runs)]
    _write_and_rebuild(env, s, [(r, _checkpoint_seq(CYCLE) + TAIL) for r in ids])
    tick("resumer group: crashed runs written")
    from confluent_kafka import Producer

    p = Producer(s.producer_config())
    topic = Topics.of(s).resume
    for r in ids:
        p.produce(topic, key=r.encode(), value=env.codec.encode(ResumeRequest(r, now_ms(), "bench", "bench")))
    if p.flush(60):
        raise RunlogError("bench: resume requests not acknowledged")
    done: list[str] = []
    lock = threading.Lock()

    def record(outcome: Any) -> None:
        with lock:
            done.append(outcome.result)

    services = [ResumerService(s, app(), on_outcome=record) for _ in range(members)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=svc.serve, kwargs={"stop": lambda: len(done) >= runs},
                                daemon=True) for svc in services]
    for t in threads:
        t.start()
    for t in threads:
        t.join(1800)
    secs = time.perf_counter() - t0
    for svc in services:
        svc.close()
    tick("resumer group: done")
    return {"runs": runs, "members": members, "seconds": secs, "runs_per_s": runs / secs,
            "completed": sum(1 for d in done if d == "completed"),
            "results": {k: done.count(k) for k in sorted(set(done))}}
