"""Whole-topic replays split by partition across worker processes (``--workers N`` of rebuild and audit).

All events of a run are in one partition, so a run is read by exactly one worker and nothing a
worker computes about a run depends on another worker's partitions: each worker reads its
partitions (assigned, from their start to the high watermarks the parent took, nothing committed)
and returns a partial result, which the caller merges. What needs every run at once (an audit's
cross-run checks) runs in the parent, after the merge.

The workers are processes started with ``spawn`` (a fresh interpreter each: no Kafka or Redis
client, no lock and no thread of the parent is inherited) so that each decodes and folds on a core
of its own; the GIL of one interpreter bounds a replay at one core. Each worker reports how many of
its records it has read through a queue; the parent draws one progress bar for all of them.

Delivery semantics: as the one-process replay (read-only on the log; the rebuild's writes are the
same offset-guarded Lua updates, per run, so two workers never write one run's keys).
"""

from __future__ import annotations

import multiprocessing
import pickle
import queue as queue_mod
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from runlog.schemas.errors import RunlogError

__all__ = ["Part", "WorkerFailed", "run_partitioned", "split_partitions"]

R = TypeVar("R")

Part = Callable[[Any, list[int], Any, Callable[[int, int], None]], Any]
"""A worker's job: ``(settings, partitions, argument, progress(done, total))`` -> its partial result
(picklable). A module-level function, so a spawned interpreter can import it."""

POLL_S = 0.2


class WorkerFailed(RunlogError):
    """A worker process ended without a result (killed, or an error that could not be sent back)."""


def split_partitions(partitions: Sequence[int], workers: int) -> list[list[int]]:
    """``partitions`` dealt round-robin to at most ``workers`` groups, none empty, each sorted.

    Raises:
        ValueError: ``workers`` is below 1.
    """
    if workers < 1:
        raise ValueError(f"workers must be 1 or more, not {workers}")
    ps = sorted(set(partitions))
    n = max(1, min(workers, len(ps)))
    groups: list[list[int]] = [[] for _ in range(n)]
    for i, p in enumerate(ps):
        groups[i % n].append(p)
    return [g for g in groups if g] or [[]]


def _worker(job: Part, settings: Any, partitions: list[int], arg: Any, index: int, q: Any) -> None:
    def progress(done: int, total: int) -> None:
        q.put(("progress", index, (done, total)))

    try:
        result = job(settings, partitions, arg, progress)
    except BaseException as err:  # noqa: BLE001 -- sent to the parent, which raises it
        try:
            payload = pickle.dumps(err)
        except Exception:  # noqa: BLE001 -- an error that cannot be pickled is sent as text
            payload = pickle.dumps(WorkerFailed(f"worker {index}: {type(err).__name__}: {err}"))
        q.put(("error", index, payload))
        return
    q.put(("result", index, result))


def run_partitioned(job: Part, settings: Any, groups: Sequence[list[int]], arg: Any = None, *,
                    progress: Callable[[int, int], None] | None = None) -> list[Any]:
    """Run ``job`` over each group of partitions in a process of its own; the partial results in
    the order of ``groups``. ``progress(done, total)`` is called in this process with the sums of
    the workers' own reports.

    Raises:
        RunlogError: a worker's own error (the first one), re-raised here; :class:`WorkerFailed`
            when a worker died without a result.
    """
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(job, settings, list(g), arg, i, q), daemon=True,
                         name=f"runlog-part-{i}") for i, g in enumerate(groups)]
    for p in procs:
        p.start()
    results: dict[int, Any] = {}
    errors: dict[int, BaseException] = {}
    counts: dict[int, tuple[int, int]] = {}
    try:
        while len(results) + len(errors) < len(procs):
            try:
                kind, i, payload = q.get(timeout=POLL_S)
            except queue_mod.Empty:
                dead = [i for i, p in enumerate(procs)
                        if i not in results and i not in errors and not p.is_alive() and q.empty()]
                for i in dead:
                    errors[i] = WorkerFailed(f"worker {i} (partitions {list(groups[i])}) exited with code "
                                             f"{procs[i].exitcode} without a result")
                continue
            if kind == "progress":
                counts[i] = payload
                if progress is not None:
                    progress(sum(d for d, _ in counts.values()), sum(t for _, t in counts.values()))
            elif kind == "result":
                results[i] = payload
            else:
                errors[i] = pickle.loads(payload)
    finally:
        for p in procs:
            p.join(timeout=5 if not errors else 0.1)
            if p.is_alive():
                p.terminate()
                p.join(5)
    if errors:
        raise errors[min(errors)]
    return [results[i] for i in range(len(procs))]
