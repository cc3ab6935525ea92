"""``runlog audit``: replay the events topic into a verified history of every run, with findings.

Delivery semantics: read-only. A consumer with a fresh group id (never
committed: ``enable.auto.commit`` is off and nothing commits; the reader of
:mod:`runlog.projections.log_reader`) is *assigned* the partitions and reads from the
start of the range up to the high watermarks taken when the audit starts;
nothing is produced, live consumer groups are not moved, and Redis is only
read: the projection's anchors (below), read *before* the watermarks are
taken, so everything the projection had accepted was already on the log the
audit reads. Replaying the same range twice against the same projection gives
the same report.

Every run is folded with :func:`runlog.projections.fold` (the one fold) and checked:

* ``rejected_event`` — an event the fold refused (stale epoch of a fenced
  writer, a seq gap, a replayed seq), one finding per event, with why. Gapless
  seq and rising epochs are exactly what the fold accepts, so a gap or a falling
  epoch always shows up here.
* ``hash_chain`` — an accepted event whose ``prev_hash`` is not the
  :func:`runlog.schemas.event_hash` of the accepted event before it (by that event's
  ``hash_version``: version 2 is the sha256 of its record's Avro body as read from
  the topic, never a re-encoding; version 1 its canonical JSON); the finding names
  the seq whose content no longer matches what its successor recorded (the
  edited event), or the seq after which the chain was cut.
* ``checkpoint_artifact`` — an artifact of a checkpoint missing from the
  artifact store (``RUNLOG_ARTIFACT_ROOT``) or hashing to something else; named
  by the first checkpoint that lists it.
* ``open_effect`` — an effect intent without a result or a reconcile in a run
  that is not ``RUNNING`` (completed, failed, blocked). A ``RUNNING`` run's open
  intents are listed in the report as open, not as findings: its writer (or the
  resumer) may still close them.
* ``effect_twice`` — more than one accepted ``EFFECT_RESULT`` for one delivery
  key within one run (resume executed an effect again). The same key in two
  runs is listed in the report (``shared_delivery_keys``) but is not a finding:
  two runs may deliver one object revision to different environments (the
  demo's two worlds do), and run-level idempotency is the run key's business.
* ``diverged`` — an accepted ``CALL_DIVERGED``: a resume ran stage code that made another
  call (other tool or other arguments) at the position of a recorded one; the recorded
  result was not handed back and the run blocked.
* ``undecodable`` — a record of the events topic that is not an event.
* ``truncated`` — the log ends before a seq the projection accepted: the run's
  tail (or, in a whole-topic audit, every event of the run) is missing from the
  log, or the projection was folded from another log.
* ``anchor_mismatch`` — the event at a seq the projection accepted hashes to
  something else on the log: it was changed after it was projected. This covers
  the last event of a run, which no ``prev_hash`` names, and a tail rewritten
  with a consistent chain.

The anchors: the hash chain alone cannot see the end of a run (nothing names
the last event's hash), so the projection keeps, outside the log, the seq and
``event_hash`` of the last event the fold accepted for each run (the run state's
``last_seq``/``last_hash``) and of each recent checkpoint's ``VERIFIED`` event
(``CheckpointEntry.last_hash``). :func:`audit` reads them from Redis
(``AuditOptions.anchors``) and compares them with the replayed chain. Each run
gets an ``anchor`` entry with a ``status``: ``ok`` (every anchor in the range
matches), ``truncated``, ``mismatch``, ``unchecked`` (the anchors are outside
the range read), ``no_anchor`` (a projection written before hashes existed:
nothing to compare, not a finding) or ``not_projected``. A run the projection
knows with no event on the log is reported ``truncated`` only by an audit of the
whole topic (no range). Without anchors (``--no-anchors``) the audit still sees
every edit that a later event's ``prev_hash`` names, gaps and cuts before an
event, but not a lost tail, a lost run, or an edited last event.

What people did is listed, not found: operator events (``EFFECT_RESOLVED``, ``RUN_CANCELLED``,
``SIGNAL_RECEIVED`` and the ``LEASE_ACQUIRED`` an operator took) carry ``by`` and ``why`` (also as
``reason`` when the fold gave none), ``decision`` and ``action`` in the run's event entries, and
each run lists them as ``operator_actions``. A resolved effect is closed, so it is no ``open_effect``.

A range audit (``--since`` or ``--from-offset``) folds a run that began before
the range from its first event in the range, trusting that event's seq, epoch
and ``prev_hash`` (the run is marked ``partial``); the rest is checked as usual.

The audit is three modules: this one reads the topic and runs an audit; the checks are
:class:`~runlog.processors.audit.checks.Auditor`'s (:mod:`runlog.processors.audit.checks`); the report, its
findings and the anchors are plain data (:mod:`runlog.processors.audit.report`). Every name stays
importable from here.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import TextIO

from runlog.processors.audit.checks import Auditor, AuditPartial
from runlog.processors.audit.report import (
    FINDING_KINDS,
    Anchor,
    AuditOptions,
    AuditReport,
    Finding,
    RunAnchors,
    RunAudit,
    load_anchors,
)
from runlog.producers import LocalArtifactStore
from runlog.producers.internal import SubjectKeys, key_id_of
from runlog.projections import ProjectionStore, RedisStore
from runlog.projections.log_reader import LogReader, progress_bar
from runlog.schemas import Codec, Settings, Topics, partition_for

__all__ = [
    "FINDING_KINDS",
    "Anchor",
    "AuditOptions",
    "AuditPartial",
    "AuditReport",
    "Auditor",
    "Finding",
    "RunAnchors",
    "RunAudit",
    "audit",
    "audit_parallel",
    "load_anchors",
    "read_records",
    "write_report",
]


# -- reading the topic -------------------------------------------------------------------------


def _plan(reader: LogReader, o: AuditOptions) -> dict[int, tuple[int, int]]:
    """Each partition's ``(start, end)`` offsets for the options (the run's partition alone with
    ``run_id``), within the watermarks taken now."""
    marks = reader.watermarks()
    parts = sorted(marks)
    if o.run_id is not None:
        parts = [partition_for(o.run_id, len(parts))]
    out: dict[int, tuple[int, int]] = {}
    for p in parts:
        start, end = marks[p]
        if o.from_offset is not None:
            start = max(start, o.from_offset)
        if o.to_offset is not None:
            end = min(end, o.to_offset)
        if o.since_ms is not None:
            at = reader.offset_at(p, o.since_ms)
            start = end if at < 0 else max(start, at)
        if o.until_ms is not None:
            at = reader.offset_at(p, o.until_ms + 1)
            if at >= 0:
                end = min(end, at)
        out[p] = (start, max(start, end))
    return out


def read_records(settings: Settings, options: AuditOptions | None = None, *,
                 progress: TextIO | None = None, plan_out: dict[int, tuple[int, int]] | None = None
                 ) -> Iterator[tuple[int, int, bytes | None, bytes | None]]:
    """``(partition, offset, key, value)`` of the events topic in the range, each partition in order.

    A fresh, never-committing reader with assigned partitions (:class:`runlog.projections.log_reader.
    LogReader`, see the module docstring). ``plan_out`` receives each partition's ``(start, end)``
    offsets; ``progress`` (a text stream) gets a progress bar.
    """
    o = options or AuditOptions()
    with LogReader(settings, name="runlog-audit") as reader:
        plan = _plan(reader, o)
        if plan_out is not None:
            plan_out.update(plan)
        with progress_bar(progress, "audit") as tick:
            for m in reader.records(plan, progress=tick):
                yield m.partition(), m.offset(), m.key(), m.value()


def audit(settings: Settings, options: AuditOptions | None = None, *,
          progress: TextIO | None = sys.stderr, projection: ProjectionStore | None = None,
          workers: int = 1) -> AuditReport:
    """Replay the range of the events topic and check it (see the module docstring).

    With ``options.anchors`` (the default) the anchors are read from ``projection``, by default the
    Redis namespace of ``settings``, before the topic is.

    ``workers`` above 1 reads and folds the partitions in that many processes
    (:func:`audit_parallel`); the report is the same as one process's.

    Raises:
        ProjectionStoreError: the projection cannot be read (audit without anchors to go on).
    """
    o = options or AuditOptions()
    t0 = time.monotonic()
    anchors = None
    if o.anchors:
        store = projection if projection is not None else RedisStore.from_settings(settings)
        try:
            anchors = load_anchors(store, o.run_id)
        finally:
            if projection is None and isinstance(store, RedisStore):
                store.client.close()
    if workers > 1:
        auditor = audit_parallel(settings, o, workers=workers, progress=progress, anchors=anchors)
    else:
        auditor = Auditor(Topics.of(settings).events, o, codec=Codec.from_settings(settings),
                          anchors=anchors)
        for p, off, key, value in read_records(settings, o, progress=progress,
                                               plan_out=auditor.report.ranges):
            auditor.feed(p, off, key, value)
    erased = erased_runs(settings, auditor.report)  # before finish: their swept artifacts are no finding
    report = auditor.finish(LocalArtifactStore(settings.artifact_root), erased=frozenset(erased))
    report.erased = erased
    report.seconds = time.monotonic() - t0
    return report


def _audit_part(settings: Settings, partitions: list[int],
                arg: tuple[AuditOptions, dict[int, tuple[int, int]]],
                progress: Callable[[int, int], None]) -> AuditPartial:
    """One worker of :func:`audit_parallel`: its partitions' ranges fed to an auditor of its own."""
    options, plan = arg
    t0 = time.monotonic()
    mine = {p: plan[p] for p in partitions}
    auditor = Auditor(Topics.of(settings).events, options, codec=Codec.from_settings(settings))
    auditor.report.ranges.update(mine)
    with LogReader(settings, name="runlog-audit") as reader:
        for m in reader.records(mine, progress=progress):
            auditor.feed(m.partition(), m.offset(), m.key(), m.value())
    return auditor.partial(time.monotonic() - t0)


def audit_parallel(settings: Settings, options: AuditOptions, *, workers: int, progress: TextIO | None = None,
                   anchors: Mapping[str, RunAnchors] | None = None) -> Auditor:
    """Read and fold the range by ``workers`` processes, each a share of the partitions
    (:mod:`runlog.projections.internal` ``run_partitioned``), and merge what they found
    (:meth:`Auditor.merged`); the returned auditor is ready for :meth:`Auditor.finish`."""
    from runlog.projections.internal import run_partitioned, split_partitions

    with LogReader(settings, name="runlog-audit") as reader:
        plan = _plan(reader, options)
    busy = [p for p, (lo, hi) in plan.items() if hi > lo]
    groups = split_partitions(busy, workers)
    with progress_bar(progress, f"audit ({len(groups)} workers)") as tick:
        parts = run_partitioned(_audit_part, settings, groups, (options, plan), progress=tick)
    merged = Auditor.merged(Topics.of(settings).events, parts, options, codec=Codec.from_settings(settings),
                            anchors=anchors)
    merged.report.ranges = dict(sorted(plan.items()))
    return merged


def erased_runs(settings: Settings, report: AuditReport) -> list[str]:
    """The runs whose subject was erased (``runlog erase``): their payloads read nowhere, by design, and
    their chains and metadata still verify. Empty with encryption off or no keyring. Only the keyring's
    tombstones are read: no key provider is asked (the audit needs no key, nor a transit token)."""
    if not settings.encryption or not Path(settings.keyring).exists():
        return []
    keys = SubjectKeys(settings.keyring)  # is_erased reads <keyring>/erased/, never the provider
    return [run_id for run_id, run in report.runs.items()
            if run.state is not None and run.state.subject is not None
            and keys.is_erased(key_id_of(run.state.subject))]


def write_report(report: AuditReport, out_dir: str | Path) -> tuple[Path, Path]:
    """Write ``audit.json`` and ``audit.html`` (self-contained) into ``out_dir``; returns both paths.
    Both files are owner-only (0600: the report quotes the runs' payload references and errors), and
    so is ``out_dir`` when this creates it (0700)."""
    from runlog.processors.audit.html import render_html

    out = Path(out_dir)
    if not out.exists():
        out.mkdir(mode=0o700, parents=True)
        out.chmod(0o700)  # mkdir's mode is masked by the umask
    doc = report.to_dict()
    jp, hp = out / "audit.json", out / "audit.html"
    _write_private(jp, json.dumps(doc, indent=1, sort_keys=True) + "\n")
    _write_private(hp, render_html(doc))
    return jp, hp


def _write_private(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)  # a report written before keeps its mode through O_CREAT
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
