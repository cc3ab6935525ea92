"""The chaos run's report: the figures as text lines (what ``runlog chaos`` prints) and as JSON."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from runlog.processors.chaos.run import ChaosResult

__all__ = ["as_json", "render", "verdict"]


def verdict(r: ChaosResult) -> list[str]:
    """What is wrong (empty: nothing): duplicates, lost events, projection differences, dead letters."""
    c = r.count
    bad = []
    if c.duplicate_count:
        bad.append(f"{c.duplicate_count} duplicate effects")
    if c.lost:
        bad.append(f"{len(c.lost)} lost events")
    if c.projection_differences or c.projection_behind:
        bad.append(f"{len(c.projection_differences)} projection differences, "
                   f"{len(c.projection_behind)} runs the live projection never reached")
    if c.dead_letters:
        bad.append(f"{c.dead_letters} dead letters")
    return bad


def render(r: ChaosResult) -> str:
    c = r.count
    out = [f"chaos: {r.seconds / 60:.1f} min (faults for {r.options.duration / 60:.1f} min), seed {r.seed}"]
    out.append(f"faults injected      {sum(r.faults.values())}: "
               + (", ".join(f"{k} {n}" for k, n in r.faults.items()) or "none"))
    if r.faults_failed:
        out.append("faults not injected  " + ", ".join(f"{k} {n}" for k, n in r.faults_failed.items()))
    out.append(f"runs started         {r.started} workers, {c.runs} runs on the log, "
               f"{r.signalled} signalled, {len(r.resolved)} charges in doubt resolved")
    for run_id, how in r.resolved.items():
        out.append(f"  resolved {run_id}: {how}")
    if r.worker_ends:
        out.append("workers ended        " + ", ".join(f"{k} {n}" for k, n in r.worker_ends.items()))
    out.append("runs by status       " + ", ".join(f"{k} {n}" for k, n in c.statuses.items()))
    out.append("effects              " + ", ".join(f"{k} {n}" for k, n in c.effects.items()))
    out.append(f"duplicate effects    {c.duplicate_count}"
               + "".join(f"\n  {kind}: {', '.join(keys[:5])}" for kind, keys in c.duplicates.items() if keys))
    out.append(f"lost events          {len(c.lost)} of {c.acked} acknowledged ({c.events} events on the log)"
               + (f": {', '.join(c.lost[:10])}" if c.lost else ""))
    out.append(f"projection diffs     {len(c.projection_differences)}"
               + (f": {', '.join(c.projection_differences[:10])}" if c.projection_differences else "")
               + (f"; {len(c.projection_behind)} runs never projected" if c.projection_behind else ""))
    out.append(f"dead letters         {c.dead_letters}")
    out.append(f"members died         {len(r.died)}" + (": " + ", ".join(f"{n} (exit {code})" for n, code
                                                                        in r.died.items()) if r.died else ""))
    for run_id, why in c.reasons.items():
        out.append(f"  not completed {run_id}: {why}")
    bad = verdict(r)
    out.append("verdict              " + ("FAILED: " + "; ".join(bad) if bad else "ok"))
    return "\n".join(out)


def as_json(r: ChaosResult) -> str:
    doc: dict[str, Any] = asdict(r)
    doc["options"]["workdir"] = str(r.options.workdir)
    doc["verdict"] = verdict(r)
    return json.dumps(doc, indent=2, default=str)
