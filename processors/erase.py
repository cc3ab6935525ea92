"""``runlog erase``: crypto-shredding of one subject (a tenant or customer whose runs name it).

The log is immutable and the audit's hash chain must keep verifying, so nothing is rewritten: the
subject's data key is destroyed instead (:meth:`runlog.producers.internal.SubjectKeys.erase` deletes the
wrapped key and leaves a tombstone with who, why and when), and every payload sealed under it, wherever it
lies (the events and streams topics, Redis, the artifact store, backups), reads nowhere from then on
(:class:`~runlog.schemas.errors.SubjectErased`). Then:

1. the subject's runs are found on the events topic (``RUN_STARTED`` attribute ``runlog.subject``);
2. each open one (not ``COMPLETED``, ``FAILED``, ``CANCELLED`` or already ``BLOCKED``) ends ``BLOCKED``: the
   operator takes its lease by force at a new epoch (``LEASE_ACQUIRED`` with ``action=erase``, who, why)
   and appends ``RUN_BLOCKED`` with error ``SubjectErased`` and attributes ``reason=erased``, ``by``,
   ``why``, ``at``; no new event type is needed, so no schema change;
3. the sweep: stored artifacts whose envelope names the subject's key are deleted from the local artifact
   store (their bytes are unreadable already; this frees the space), and the count is reported.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from runlog.processors.operate import (
    ATTEMPTS,
    OperatorRefused,
    _iso_now,
    _load,
    _runner,
    _who,
    _why,
    take_lease,
)
from runlog.producers.internal import key_id_of, subject_keys
from runlog.projections import RunStatus
from runlog.projections.log_reader import read_topic
from runlog.schemas import Codec, ErrorInfo, EventType, RunEvent, Settings
from runlog.schemas.errors import DecodeError
from runlog.schemas.internal import SUBJECT_ATTRIBUTE

__all__ = ["EraseResult", "erase_subject", "runs_of_subject"]

_MAGIC = b"\x00RLE\x01"
_DONE = (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED, RunStatus.BLOCKED)


@dataclasses.dataclass
class EraseResult:
    """What an erase did."""

    subject_key: str
    """The subject's key id (the subject itself is not repeated in reports)."""
    destroyed: bool
    """False: the key had been destroyed by an earlier erase (this one still blocked and swept)."""
    runs: list[str]
    blocked: list[str]
    artifacts_deleted: int

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def detail(self) -> str:
        was = "destroyed" if self.destroyed else "was already destroyed"
        return (f"subject key {self.subject_key} {was}; "
                f"{len(self.runs)} runs, {len(self.blocked)} open ones blocked (erased); "
                f"{self.artifacts_deleted} stored artifacts deleted")


def runs_of_subject(settings: Settings, subject: str) -> list[str]:
    """The run ids whose ``RUN_STARTED`` names ``subject``, in log order (the whole events topic is read)."""
    codec = Codec.from_settings(settings)
    found: list[str] = []
    for batch in read_topic(settings):
        for msg in batch:
            value = msg.value()
            if value is None:
                continue
            try:
                ev = codec.decode(value, RunEvent)
            except DecodeError:
                continue
            if ev.type is EventType.RUN_STARTED and ev.attributes.get(SUBJECT_ATTRIBUTE) == subject \
                    and ev.run_id not in found:
                found.append(ev.run_id)
    return found


def _block(settings: Settings, run_id: str, who: str, why: str) -> bool:
    """End one open run ``BLOCKED`` (reason ``erased``); False when it was not open."""
    with _runner(settings) as runner:
        for _ in range(ATTEMPTS):
            state = _load(settings, run_id)
            if state.status in _DONE:
                return False
            # the erase's own record stays readable (who, why): the subject's key is gone, and the
            # erasure must still be accountable
            taken = take_lease(settings, runner, state, by=who, action="erase", reason=why, force=True,
                               seal_texts=False)
            if taken is None:
                continue
            session, _ = taken
            try:
                session.append(EventType.RUN_BLOCKED, confirm=True,
                               error=ErrorInfo("SubjectErased", "erased", False),
                               attributes={"reason": "erased", "by": who, "why": why, "at": _iso_now(),
                                           "status_before": state.status.value})
            finally:
                session.close(release=True)
            if runner.active is not None:
                runner.active.cancel(run_id)
            return True
    raise OperatorRefused(f"run {run_id} kept moving while erasing (tried {ATTEMPTS} times); run erase again")


def _sweep(root: Path, key_id: str) -> int:
    """Delete the stored artifacts sealed under ``key_id``."""
    head = _MAGIC + bytes.fromhex(key_id)
    deleted = 0
    if not root.exists():
        return 0
    for dirpath, _, files in os.walk(root / "sha256"):
        for name in files:
            path = Path(dirpath) / name
            try:
                with path.open("rb") as f:
                    if f.read(len(head)) != head:
                        continue
                path.unlink()
                deleted += 1
            except OSError:
                continue
    return deleted


def erase_subject(settings: Settings, subject: str, *, by: str, reason: str) -> EraseResult:
    """Destroy ``subject``'s data key, block its open runs (reason ``erased``), sweep its stored artifacts.

    Raises:
        OperatorRefused: a blank subject, ``by`` or ``reason``; encryption is off (there is no key to
            destroy: the payloads are in clear).
    """
    who, why = _who(by), _why(reason)
    subject = (subject or "").strip()
    if not subject:
        raise OperatorRefused("say whose data: --subject is required")
    if not settings.encryption:
        raise OperatorRefused("payload encryption is off (RUNLOG_ENCRYPTION): there is no data key to "
                              "destroy, and payloads are in clear")
    key_id = key_id_of(subject)
    destroyed = subject_keys(settings).erase(subject, by=who, reason=why)
    runs = runs_of_subject(settings, subject)
    blocked = [run_id for run_id in runs if _block(settings, run_id, who, why)]
    deleted = _sweep(Path(settings.artifact_root), key_id)
    return EraseResult(key_id, destroyed, runs, blocked, deleted)
