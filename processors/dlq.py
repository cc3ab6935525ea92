"""Dead letters: records of the events topic that are not valid events, kept with why and where from.

A dead letter carries the original key and bytes unchanged, plus headers
``runlog.error.reason``, ``runlog.error.detail``, ``runlog.original.topic``,
``runlog.original.partition`` and ``runlog.original.offset``. It is produced at
least once (a crash before the input offset is committed produces it again);
readers deduplicate by the original topic, partition and offset.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from runlog.projections.batch import DeadLetter

__all__ = [
    "H_DETAIL",
    "H_OFFSET",
    "H_PARTITION",
    "H_REASON",
    "H_TOPIC",
    "MAX_DETAIL",
    "DeadLetterRecord",
    "headers",
    "parse_headers",
    "to_record",
]

H_REASON = "runlog.error.reason"
H_DETAIL = "runlog.error.detail"
H_TOPIC = "runlog.original.topic"
H_PARTITION = "runlog.original.partition"
H_OFFSET = "runlog.original.offset"
MAX_DETAIL = 1000


@dataclass(frozen=True, slots=True)
class DeadLetterRecord:
    """What goes on the dead-letter topic."""

    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...]


def headers(reason: str, detail: str, topic: str, partition: int,
            offset: int) -> tuple[tuple[str, bytes], ...]:
    """The headers of a dead letter: why (``detail`` cut to :data:`MAX_DETAIL` characters) and
    where the original record was. Every process that dead-letters a record builds them here."""
    return (
        (H_REASON, reason.encode()),
        (H_DETAIL, detail[:MAX_DETAIL].encode("utf-8", "replace")),
        (H_TOPIC, topic.encode()),
        (H_PARTITION, str(partition).encode()),
        (H_OFFSET, str(offset).encode()),
    )


def to_record(dl: DeadLetter) -> DeadLetterRecord:
    """A dead letter of the projector, as it goes on the dead-letter topic."""
    r = dl.record
    return DeadLetterRecord(r.key, r.value or b"",
                            headers(dl.reason, dl.detail, r.topic, r.partition, r.offset))


def parse_headers(headers: Iterable[tuple[str, bytes | None]] | Mapping[str, bytes] | None) -> dict[str, str]:
    """Headers of a dead letter as text (for audits and tests)."""
    if headers is None:
        return {}
    items = headers.items() if isinstance(headers, Mapping) else headers
    return {k: (v or b"").decode("utf-8", "replace") for k, v in items}
