"""An in-memory schema log that records what was published, and on which thread."""

from __future__ import annotations

import threading
from typing import Any


class RecordingSchemaLog:
    """A :class:`runlog.schemas._codec.SchemaSource`: ``published`` holds (record name, thread name)
    per publish, ``docs`` the schemas by fingerprint."""

    def __init__(self) -> None:
        self.published: list[tuple[str, str]] = []
        self.docs: dict[bytes, dict[str, Any]] = {}

    def publish(self, record_name: str, fingerprint: bytes, schema: dict[str, Any]) -> None:
        self.published.append((record_name, threading.current_thread().name))
        self.docs[fingerprint] = schema

    def lookup(self, fingerprint: bytes) -> dict[str, Any] | None:
        return self.docs.get(fingerprint)
