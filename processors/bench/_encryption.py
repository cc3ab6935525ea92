"""What payload encryption costs (``runlog bench --only encryption``): the same work with
``RUNLOG_ENCRYPTION`` off and on, side by side in one run, in alternating rounds.

- **append**: events/s of ``RunSession.append`` over many runs, each event a ``TOOL_RESULT`` carrying
  its own small payload (a JSON result of about 240 bytes of prose-like text, different per event:
  :func:`_payload`) as an inline ref made in the timed loop: off, ``store.inline`` base64s it; on, it
  is sealed first (AES-256-GCM under the default subject's data key, the synthetic nonce a keyed
  BLAKE2b). ``append_on_over_off`` is on / off.
- **steps**: durable calls/s of the steps section's workflow (:mod:`runlog.processors.bench._steps`,
  eight calls and one confirmed effect intent per run) on one AsyncRunner, N concurrent runs, with
  every argument, result, stage output and parameter sealed on the encrypted side.
  ``steps_on_over_off`` is on / off.

With more than one round a side, one round a side runs first untimed: on a freshly started broker the
first rounds ran up to a third slower. Each round starts with a full collection: the collector's
generations carry over from round to round, and measured here a full collection (about 60 ms with
the bench's heap) fell in the same side's rounds run after run (the off and on rounds each make about
six second-generation collections, and the tenth triggers a full one), adding 6 us an event to that
side alone.

Both sides write to namespaces of their own on the same broker and Redis, and the encrypted side's
keyring is a fresh local one (its data key is unwrapped once per process and cached, as in a worker).
Ratios are medians of rounds (eleven a side of appends, five of durable calls in the quick size); the
target is a cost of at most 15% (a ratio >= 0.85). Beside the throughput ratios, the CPU time per event
/ call (the process's, every thread's) of each side, and its ratio off / on: on a machine shared with
other work, wall-clock throughput drifts between rounds far more than CPU time does.
"""

from __future__ import annotations

import asyncio
import gc
import itertools
import json
import random
import string
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from runlog.processors.bench._env import BenchEnv
from runlog.processors.bench._events import median, ratio
from runlog.processors.bench._steps import CALLS_PER_RUN, _runlog_async
from runlog.processors.bench._write import _sessions
from runlog.producers.internal import RedisLeaseManager, RunWriter, store_from_settings
from runlog.schemas import EventType
from runlog.schemas.settings import Settings

__all__ = ["bench_encryption"]

Tick = Callable[[str], None]

_WORD_LENGTHS = (2, 3, 3, 4, 4, 5, 5, 6, 7, 8, 9, 11)
_WORDS = random.Random(7)
_VOCABULARY = tuple("".join(_WORDS.choice(string.ascii_lowercase)
                            for _ in range(_WORDS.choice(_WORD_LENGTHS))) for _ in range(4000))
_ZIPF = tuple(itertools.accumulate(1 / (rank + 1) for rank in range(len(_VOCABULARY))))


def _text(rng: random.Random, words: int) -> str:
    return " ".join(rng.choices(_VOCABULARY, cum_weights=_ZIPF, k=words))


def _payload(run: int, seq: int) -> bytes:
    """A tool's JSON result of about 240 bytes (200-300), different per run and event: a title and an
    answer of words drawn from a 4,000-word vocabulary by Zipf's law (as words are in prose) and a score.

    lz4 shrinks a fetch of these base64 refs about 1.9 times, as it does base64 of English text (1.8).
    A repeated phrase (the payload until 2026-12-07: ``"lorem ipsum " * 14``, a 12-byte period that
    base64 keeps) shrank 25 times, so the clear side sent the broker about a thirtieth of the sealed
    side's payload bytes (11 against 350 an event), a saving real payloads do not give
    (docs/performance.md, "What the append ratio measured").
    """
    rng = random.Random(run * 1_000_003 + seq)
    return json.dumps({"run": run, "seq": seq, "score": round(rng.random(), 4), "title": _text(rng, 4),
                       "answer": _text(rng, 24)}, sort_keys=True).encode()


def _append_round(settings: Settings, env: BenchEnv, payloads: list[list[bytes]],
                  tag: str) -> tuple[float, float]:
    """Events/s and CPU microseconds per event (the process's, every thread's) of one round."""
    store = store_from_settings(settings)
    writer = RunWriter(settings)
    leases = RedisLeaseManager(env.redis, settings)
    try:
        per_run, runs = len(payloads), len(payloads[0])
        sessions = _sessions(settings, writer, leases, runs, tag)
        gc.collect()  # each round starts from an empty collector (the module docstring)
        t0, c0 = time.perf_counter(), time.process_time()
        for seq in range(per_run):
            row = payloads[seq]
            for r, s in enumerate(sessions):
                s.append(EventType.TOOL_RESULT, stage="work", tool="search.query", call_id=f"work/q/{seq}",
                         payload_ref=store.inline(row[r], "application/json"))
        for s in sessions:
            s.flush()
        n = per_run * runs
        rate, cpu_us = n / (time.perf_counter() - t0), (time.process_time() - c0) / n * 1e6
        for s in sessions:
            s.close()
        return rate, cpu_us
    finally:
        writer.close()
        leases.close()


def bench_encryption(env: BenchEnv, *, events: int, runs: int, rounds: int, steps_runs: int,
                     tick: Tick, append_rounds: int | None = None) -> dict[str, Any]:
    """Append events/s and durable calls/s with encryption off against on (see the module docstring):
    ``append_rounds`` rounds a side of appends (default ``rounds``), ``rounds`` of durable calls."""
    work = Path(env.workdir)
    off = env.settings("enc-off").with_(artifact_root=str(work / "enc-off-artifacts"))
    on = env.settings("enc-on").with_(artifact_root=str(work / "enc-on-artifacts"), encryption=True,
                                      keyring=str(work / "enc-keyring"))
    per_run = max(events // runs, 1)
    payloads = [[_payload(r, seq) for r in range(runs)] for seq in range(per_run)]
    rates: dict[str, list[float]] = {"off": [], "on": []}
    cpu: dict[str, list[float]] = {"off": [], "on": []}
    timed = rounds if append_rounds is None else append_rounds
    if timed > 1:  # a round a side not timed: the broker's and the process's first round ran slow
        for side, s in (("off", off), ("on", on)):
            _append_round(s, env, payloads, f"ew{side}")
            tick(f"encryption append {side} warm-up")
    for rnd in range(timed):
        for side, s in (("off", off), ("on", on)) if rnd % 2 == 0 else (("on", on), ("off", off)):
            rate, cpu_us = _append_round(s, env, payloads, f"e{side}{rnd}")
            rates[side].append(rate)
            cpu[side].append(cpu_us)
            tick(f"encryption append {side} round {rnd + 1}")
    steps: dict[str, list[float]] = {"off": [], "on": []}
    steps_cpu: dict[str, list[float]] = {"off": [], "on": []}
    first = 0
    for rnd in range(rounds):
        for side, s in (("off", off), ("on", on)) if rnd % 2 == 0 else (("on", on), ("off", off)):
            gc.collect()
            seconds, cpu_s, _events, completed, errors = asyncio.run(_runlog_async(s, steps_runs, first))
            first += steps_runs + 1
            if errors or completed != steps_runs:
                raise RuntimeError(f"bench encryption ({side}): {completed}/{steps_runs} runs completed; "
                                   f"{errors[:1]}")
            steps[side].append(steps_runs * CALLS_PER_RUN / seconds)
            steps_cpu[side].append(cpu_s / (steps_runs * CALLS_PER_RUN) * 1e6)
            tick(f"encryption steps {side} round {rnd + 1}")
    a_off, a_on = median(rates["off"]), median(rates["on"])
    s_off, s_on = median(steps["off"]), median(steps["on"])
    return {"append_on_over_off": ratio(a_on, a_off), "steps_on_over_off": ratio(s_on, s_off),
            "append_off_events_per_s": a_off, "append_on_events_per_s": a_on,
            "steps_off_calls_per_s": s_off, "steps_on_calls_per_s": s_on,
            "append_cpu_us_per_event": {k: median(v) for k, v in cpu.items()},
            "steps_cpu_us_per_call": {k: median(v) for k, v in steps_cpu.items()},
            "append_cpu_off_over_on": ratio(median(cpu["off"]), median(cpu["on"])),
            "steps_cpu_off_over_on": ratio(median(steps_cpu["off"]), median(steps_cpu["on"])),
            "append_rounds": rates, "steps_rounds": steps, "events_per_round": per_run * runs, "runs": runs,
            "steps_runs": steps_runs, "rounds": rounds,
            "append_rounds_per_side": len(rates["off"])}
