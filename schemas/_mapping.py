"""Runlog's records to the dicts fastavro writes, and back: the Avro style of the one generic
mapping (:class:`runlog.schemas._plain.PlainMapping`), every record an object of all its fields, gathered
by Python type in :data:`KINDS` with each record's Avro full name."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from runlog.schemas._plain import PlainMapping
from runlog.schemas._types import Checkpoint, Effect, ResumeRequest, RunEvent, RunSubmission, StreamRecord

__all__ = ["AVRO", "KINDS", "Kind"]

AVRO = PlainMapping(complete=True)
"""Records as fastavro's dicts: every field by name (fastavro resolves to the reader schema, so
every field is present when read)."""

T = TypeVar("T")


@dataclass(frozen=True)
class Kind(Generic[T]):
    """A record: its Avro full name, its Python type and the mapping each way."""

    record_name: str
    py_type: type[T]
    to_dict: Callable[[T], dict[str, Any]]
    from_dict: Callable[[dict[str, Any]], T]


def _kind(record_name: str, cls: type[T]) -> Kind[T]:
    return Kind(record_name, cls, AVRO.to_plain(cls), AVRO.from_plain(cls))


KINDS: dict[type[Any], Kind[Any]] = {
    RunEvent: _kind("runlog.RunEvent", RunEvent),
    Checkpoint: _kind("runlog.Checkpoint", Checkpoint),
    Effect: _kind("runlog.Effect", Effect),
    ResumeRequest: _kind("runlog.ResumeRequest", ResumeRequest),
    StreamRecord: _kind("runlog.StreamRecord", StreamRecord),
    RunSubmission: _kind("runlog.RunSubmission", RunSubmission),
}
