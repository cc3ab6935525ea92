"""``runlog versions``: per ``workflow@version``, its open runs, the runs parked for a member serving
it and the live members (:mod:`runlog.processors.resume._drains`): when a version can leave its App."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from runlog.processors.cli.codes import EXIT_OK
from runlog.schemas import Settings, now_ms

__all__ = ["read_versions", "register"]

_OPEN = ("PENDING", "RUNNING", "WAITING", "BLOCKED", "FAILED")
"""``runlog.processors.resume._drains.OPEN`` (not imported here: the CLI imports drivers lazily)."""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "versions", help="per workflow@version: open runs by status, parked runs, live members",
        description="Every workflow@version that has open runs (PENDING, RUNNING, WAITING, BLOCKED, "
        "FAILED) in the Redis projection, runs parked for a member serving it, or live resumer members "
        "serving it: the open runs by status, the open run whose last event is the oldest, the runs "
        "parked for a member and the live members. A version with open runs and no live member is "
        "named ('no live member serves orders@1'). A version can leave its App once its open "
        "column is 0 (in --json, drained: true) and no writer starts it any more. While the "
        "projection is not marked ready (or no projector wrote it), open runs are read from the "
        "events topic, with a note on stderr. Exit 0.")
    p.add_argument("--workflow", metavar="NAME[@VERSION]",
                   help="only this workflow (a name), or one version of it (name@version)")
    p.add_argument("--json", action="store_true", help="print one JSON array, an object per version")
    p.set_defaults(func=_versions)


def read_versions(settings: Settings, *, log_fallback: bool = True) -> tuple[list[Any], str | None]:
    """The :class:`~runlog.processors.resume._drains.VersionRow` rows, and None, or the note on why the
    projection's open runs are not counted: then, with ``log_fallback``, counted from the events
    topic (the note says so), else not counted."""
    from runlog.processors.resume._drains import open_runs_of, version_rows, version_table
    from runlog.processors.resume._versions import VersionRoutes
    from runlog.projections import RedisStore

    store = RedisStore.from_settings(settings)
    try:
        routes = VersionRoutes(store.client, store.prefix)
        rows, note = version_table(store, routes)
        if note is None or not log_fallback:
            return rows, note
        from runlog.processors.inspect import runs_from_log

        views = routes.views()
    finally:
        store.client.close()
    rows = version_rows(open_runs_of(runs_from_log(settings).values()), views)
    return rows, f"open runs read from the events topic: {note}"


def _age(ms: int | None) -> str:
    if ms is None:
        return "-"
    s = max(0, (now_ms() - ms) // 1000)
    return f"{s}s" if s < 120 else f"{s // 60}m" if s < 7200 else f"{s // 3600}h" if s < 172_800 \
        else f"{s // 86400}d"


def _versions(args: argparse.Namespace) -> int:
    settings = Settings.from_env()
    rows, note = read_versions(settings)
    if note:
        print(f"runlog versions: {note}", file=sys.stderr)
    if args.workflow:
        rows = [r for r in rows if args.workflow in (r.workflow, r.label)]
    if args.json:
        print(json.dumps([r.to_dict() for r in rows]))
        return EXIT_OK
    if not rows:
        print("no open runs, parked runs or live members for any workflow version"
              + (f" of {args.workflow}" if args.workflow else ""))
        return EXIT_OK
    head = ("version", *_OPEN, "open", "oldest open run (last event)", "parked", "members")
    cells = [(r.label, *(str(r.runs[s]) for s in _OPEN), str(r.open),
              f"{r.oldest_run} ({_age(r.oldest_at)} ago)" if r.oldest_run else "-", str(r.waiting),
              ", ".join(r.members) or "none live") for r in rows]
    widths = [max(len(c[i]) for c in [head, *cells]) for i in range(len(head))]
    right = set(range(1, len(_OPEN) + 2)) | {len(head) - 2}

    def line(cs: tuple[str, ...]) -> str:
        return " ".join(c.rjust(w) if i in right else c.ljust(w)
                        for i, (c, w) in enumerate(zip(cs, widths, strict=True))).rstrip()

    newest = {r.workflow: r.label for r in rows}  # rows go oldest version first
    print(line(head))
    for r, cs in zip(rows, cells, strict=True):
        print(line(cs))
        problem = r.problem()
        if problem:
            print(f"    {problem}")
        elif r.drained and newest[r.workflow] != r.label:
            print(f"    no open runs of {r.label}: it can leave the App once no writer starts it")
    return EXIT_OK
