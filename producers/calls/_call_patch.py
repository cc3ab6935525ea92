"""``ctx.patched(patch_id)``: a recorded marker that lets a long stage change its calls for new runs
while runs recorded without it replay exactly (the stage context's patch table; the rules are in
:mod:`runlog.producers.calls._call_steps`' docstring)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Mapping

from runlog.producers.calls._call_positions import CallPositions
from runlog.producers.calls._calls import PATCHED, RecordedCall
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.schemas.errors import WorkflowDefinitionError

__all__ = ["PatchTable"]


class PatchTable:
    """The patches one stage execution decided, and the positions their markers take.

    Args:
        stage: the stage's name.
        positions: the stage's call positions (a taken patch's marker claims one).
        at_index: the stage's recorded calls by position.
        recorded_end: one past the last position the log records for the stage.
    """

    def __init__(self, stage: str, positions: CallPositions, at_index: Mapping[int, RecordedCall],
                 recorded_end: int, digest: Callable[[bytes], str] = sha256_hex) -> None:
        self.stage = stage
        self._digest = digest  # the store's: keyed where payloads are encrypted, as the marker call's
        self._positions = positions
        self._at_index = at_index
        self._recorded_end = recorded_end
        self._decided: dict[str, bool] = {}
        self._lock = threading.Lock()
        self.asking = threading.Lock()
        """Held by a ``def`` stage's asker until its marker is recorded (a second asker waits)."""
        self._aasking: asyncio.Lock | None = None

    def aasking(self) -> asyncio.Lock:
        """:attr:`asking` for an ``async def`` stage (made on its loop at first use)."""
        if self._aasking is None:
            self._aasking = asyncio.Lock()
        return self._aasking

    @staticmethod
    def marker_args(patch_id: str) -> dict[str, str]:
        """The request of a patch's marker call."""
        return {"patch": patch_id}

    def decide(self, patch_id: str) -> tuple[bool, int | None]:
        """Whether this execution of the stage takes ``patch_id``, and the position its marker is to be
        recorded at (None: nothing to record, the patch was decided before or is not taken)."""
        if not isinstance(patch_id, str) or not patch_id:
            raise WorkflowDefinitionError(f"patched() needs a non-empty patch id, got {patch_id!r}")
        request_hash = self._digest(canonical_json(self.marker_args(patch_id)))

        def take(index: int) -> bool:
            rec = self._at_index.get(index)
            if rec is None:
                return index >= self._recorded_end  # new territory: this run reaches it on new code
            # the marker of this very patch, or a run recorded before the patch existed
            return (rec.call_id == f"{self.stage}/{PATCHED.name}/{index}"
                    and rec.request_hash in (None, request_hash))

        with self._lock:
            known = self._decided.get(patch_id)
            if known is not None:
                return known, None
            index, taken = self._positions.claim_if(take)
            self._decided[patch_id] = taken
        return taken, (index if taken else None)
