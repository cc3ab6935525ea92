"""The fleet acceptance (issue #37) on the real broker and Redis: a fake model provider in its own
process (:mod:`tests.integration.fake_provider`, 600 requests and 100,000 tokens per ``per_s``, 429
past them) and runs from three tenants (weights 1:1:2) submitted by a client, executed by two
``runlog worker`` processes, one SIGKILLed when a third of the runs have completed and started
again. Measured and returned: the provider's counters (429s), the share of its token limit the fleet
used over the busy periods, each tenant's share of completions while all three were backlogged,
effects applied per run, ``RUN_STARTED`` / ``RUN_COMPLETED`` per run on the log, and each run's
outputs read through ``handle.result()`` from this (third) process.

The full version (1,000 runs, one-minute limits; about 6 minutes)::

    python -m tests.integration.fleet.acceptance --runs 1000 --per 60

The CI variant (``test_acceptance.py``, marked slow) runs 600 runs against the same one-minute limits.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from runlog.processors.fleet import Client
from runlog.schemas import Settings
from tests.integration.fake_provider import stats

ROOT = Path(__file__).resolve().parents[3]
TENANTS = (("t1", 1), ("t2", 1), ("t3", 2))
APP = "tests.integration.fleet._acceptance_app:app"


def _env(settings: Settings, per_s: float) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(settings.to_env())
    env.update(ACCEPT_PER_S=str(per_s),
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    return env


def _worker(env: dict[str, str], cwd: Path, name: str, concurrency: int) -> subprocess.Popen[bytes]:
    with open(cwd / f"{name}.log", "ab") as log:  # the child holds its own copy
        return subprocess.Popen([sys.executable, "-m", "runlog", "worker", "--app", APP, "--concurrency",
                                 str(concurrency)], env=env, cwd=cwd, stdout=log, stderr=log)


def _until(what: Any, timeout: float, every: float = 0.5) -> None:
    deadline = time.monotonic() + timeout
    while not what():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f} s")
        time.sleep(every)


def utilisation(served: list[list[Any]], tokens_limit: float, per_s: float) -> dict[str, Any]:
    """The share of its token limit the fleet used while busy: the tokens served in each whole period
    from the first completion served on (``periods``; the first may pass 100%, the bucket starting
    full), and ``share``: over the whole periods after the first, the tokens served over the limit's
    (None when there is no such period: too short a run to tell). ``allowance``: all tokens served
    over the most the provider allows from the first to the last (a full bucket plus its refill)."""
    times = sorted(float(t) for t, *_ in served)
    if not times:
        return {"share": None, "periods": []}
    first, last = times[0], times[-1]
    total = sum(int(n) for _, n, *_ in served)
    periods = []
    start = first
    while start + per_s <= last:
        periods.append(round(sum(int(n) for t, n, *_ in served if start <= float(t) < start + per_s)
                             / tokens_limit, 3))
        start += per_s
    later = periods[1:]
    return {"share": round(sum(later) / len(later), 3) if later else None, "periods": periods,
            "busy_s": round(last - first, 1), "tokens": total,
            "allowance": round(total / (tokens_limit * (1 + (last - first) / per_s)), 3)}


def fairness(effects: list[list[Any]], submitted: dict[str, int]) -> dict[str, Any]:
    """Each tenant's share of the completions (effects applied, the runs' last act) while all three
    were backlogged: up to the moment the first tenant completed all its runs."""
    ordered = sorted(effects, key=lambda e: float(e[0]))
    done: Counter[str] = Counter()
    window: Counter[str] = Counter()
    for _, tenant, _ in ordered:
        done[tenant] += 1
        window[tenant] += 1
        if done[tenant] >= submitted[tenant]:
            break
    total = sum(window.values())
    weights = dict(TENANTS)
    wsum = sum(weights.values())
    return {"completions": dict(window),
            "shares": {t: round(window[t] / total, 3) for t in weights},
            "deviation": {t: round(abs(window[t] / total - w / wsum) / (w / wsum), 3)
                          for t, w in weights.items()}}


def log_counts(settings: Settings, run_ids: set[str]) -> dict[str, Counter[str]]:
    """``RUN_STARTED`` and ``RUN_COMPLETED`` the fold accepted, per run, from the whole events topic."""
    from runlog.projections import fold
    from runlog.projections.log_reader import read_topic
    from runlog.schemas import Codec, DecodeError, EventType, RunEvent, event_hash

    codec = Codec.from_settings(settings)
    states: dict[str, Any] = {}
    counts: dict[str, Counter[str]] = {r: Counter() for r in run_ids}
    for batch in read_topic(settings):
        for m in batch:
            if m.value() is None:
                continue
            try:
                ev, body = codec.decode_with_body(m.value(), RunEvent)
            except DecodeError:
                continue
            if ev.run_id not in run_ids:
                continue
            states[ev.run_id], out = fold(states.get(ev.run_id), ev, (m.partition(), m.offset()),
                                          content_hash=event_hash(ev, body))
            if out.accepted and ev.type in (EventType.RUN_STARTED, EventType.RUN_COMPLETED):
                counts[ev.run_id][ev.type.value] += 1
    return counts


def run_acceptance(settings: Settings, *, runs: int, per_s: float, workdir: Path, concurrency: int = 6,
                   kill_at: float = 1 / 3, timeout_s: float = 1800) -> dict[str, Any]:
    """The acceptance (the module docstring); returns its figures (raises nothing on a miss: the
    caller asserts)."""
    port = random.randint(22000, 22999)
    env = _env(settings, per_s)
    provider = subprocess.Popen([sys.executable, "-m", "tests.integration.fake_provider", "--port", str(port),
                                 "--requests", "600", "--tokens", "100000", "--per", str(per_s)],
                                env=env, cwd=workdir, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    assert provider.stdout is not None
    provider.stdout.readline()  # "provider on ...": it listens
    base = f"http://127.0.0.1:{port}"
    workers: list[subprocess.Popen[bytes]] = []
    figures: dict[str, Any] = {"runs": runs, "per_s": per_s}
    try:
        counts = {"t1": runs // 4, "t2": runs // 4}
        counts["t3"] = runs - counts["t1"] - counts["t2"]
        order = [t for t, n in counts.items() for _ in range(n)]
        random.Random(7).shuffle(order)
        tag = uuid.uuid4().hex[:6]
        with Client(settings, name="web") as web:
            t0 = time.monotonic()
            handles = [web.submit("agent", {"base": base, "tokens": 400 + (i * 37) % 201, "tenant": t},
                                  key=f"acc-{tag}-{i}", tenant=t, queue="agents")
                       for i, t in enumerate(order)]
            figures["submit_s"] = round(time.monotonic() - t0, 1)
            again = web.submit("agent", {"base": base, "tokens": 400, "tenant": order[0]},
                               key=f"acc-{tag}-0", tenant=order[0], queue="agents")
            figures["same_key_same_run"] = (again.run_id == handles[0].run_id and not again.created)
        t0 = time.monotonic()
        workers = [_worker(env, workdir, "a", concurrency), _worker(env, workdir, "b", concurrency)]
        _until(lambda: stats(base)["effects"] >= runs * kill_at, timeout_s)
        workers[0].send_signal(signal.SIGKILL)
        workers[0].wait(30)
        figures["killed_at_effects"] = stats(base)["effects"]
        workers[0] = _worker(env, workdir, "a2", concurrency)
        _until(lambda: stats(base)["effects"] >= runs, timeout_s)
        figures["fleet_s"] = round(time.monotonic() - t0, 1)
        # a third process awaits every run's result by its id
        with Client(settings, name="elsewhere") as reader:
            t1 = time.monotonic()
            results = {h.run_id: reader.run(h.run_id).result(timeout=120) for h in handles}
            figures["results_s"] = round(time.monotonic() - t1, 1)
        figures["results_completed"] = sum(1 for r in results.values() if r.completed)
        figures["results_with_outputs"] = sum(
            1 for r in results.values()
            if r.outputs.get("think", {}).get("text") == "ok"
            and str(r.outputs.get("deliver", {}).get("external_id", "")).startswith("fx-"))
        s = stats(base)
        log = stats(base, "log")
        figures["provider"] = s
        figures["tokens"] = utilisation(log["served"], 100_000, per_s)
        figures["fairness"] = fairness(log["effects"], counts)
        effects_per_run = Counter(r for _, _, r in log["effects"])
        figures["effects_applied"] = len(log["effects"])
        figures["runs_with_one_effect"] = sum(1 for h in handles if effects_per_run[h.run_id] == 1)
        per_run = log_counts(settings, {h.run_id for h in handles})
        figures["started_once"] = sum(1 for c in per_run.values() if c["RUN_STARTED"] == 1)
        figures["completed_once"] = sum(1 for c in per_run.values() if c["RUN_COMPLETED"] == 1)
        return figures
    finally:
        for w in workers:
            if w.poll() is None:
                w.send_signal(signal.SIGTERM)
        for w in workers:
            try:
                w.wait(60)
            except subprocess.TimeoutExpired:
                w.kill()
        provider.terminate()
        provider.wait(30)
        provider.stdout.close()


def check(f: dict[str, Any]) -> list[str]:
    """What the acceptance requires of the figures; the misses (empty: passed)."""
    n = f["runs"]
    misses = []
    want = {"results_completed": n, "results_with_outputs": n, "effects_applied": n,
            "runs_with_one_effect": n, "started_once": n, "completed_once": n}
    misses += [f"{k} {f[k]} != {v}" for k, v in want.items() if f[k] != v]
    if f["provider"]["refused"] != 0:
        misses.append(f"the provider answered 429 {f['provider']['refused']} times")
    share = f["tokens"]["share"]
    if share is None or share < 0.9:
        misses.append(f"token limit used {share} < 90% over the whole periods after the first")
    dev = f["fairness"]["deviation"]
    misses += [f"tenant {t}'s share deviates {d:.1%} from its weight" for t, d in dev.items() if d > 0.10]
    if not f["same_key_same_run"]:
        misses.append("a second submit with the same key gave another run")
    return misses


def main() -> None:
    p = argparse.ArgumentParser(description="the fleet acceptance (issue #37)")
    p.add_argument("--runs", type=int, default=1000)
    p.add_argument("--per", type=float, default=60.0, help="the provider's period in seconds")
    p.add_argument("--concurrency", type=int, default=6, help="each worker's")
    a = p.parse_args()
    base = Settings.from_env()
    tag = uuid.uuid4().hex[:8]
    settings = base.with_(topic_prefix=f"acc-{tag}.", redis_prefix=f"acc-{tag}",
                          resumer_group=f"acc-{tag}", lease_ttl_ms=3000, sweep_interval_ms=1000)
    from runlog.processors.admin import ensure_topics

    ensure_topics(settings)
    with tempfile.TemporaryDirectory() as d:
        figures = run_acceptance(settings, runs=a.runs, per_s=a.per, workdir=Path(d),
                                 concurrency=a.concurrency)
    print(json.dumps(figures, indent=1))
    misses = check(figures)
    print("PASSED" if not misses else "MISSED: " + "; ".join(misses))
    sys.exit(1 if misses else 0)


if __name__ == "__main__":
    main()
