"""``ctx.patched(patch_id)``: a recorded marker that lets a long stage change its calls for new runs
while runs recorded without it replay exactly (a mixin of the stage context; the rules are in
:mod:`runlog.producers.calls._call_steps`' docstring)."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from runlog.producers.base._protocol import Steps
from runlog.producers.calls._calls import PATCHED, RecordedCall
from runlog.producers.calls._keys import canonical_json, sha256_hex
from runlog.producers.define._tools import Tool
from runlog.schemas.errors import WorkflowDefinitionError

__all__ = ["PatchSteps"]


class PatchSteps:
    """The patch marker's part of a stage context."""

    stage: str
    failure: BaseException | None
    _lock: threading.Lock
    _patches: dict[str, bool]
    _at_index: dict[int, RecordedCall]
    _next_index: int
    _recorded_end: int

    def _call_steps(self, tool: Tool, index: int, args: Mapping[str, Any]) -> Steps[Any]:
        raise NotImplementedError

    def _patched_steps(self, patch_id: str) -> Steps[bool]:
        """Whether this execution of the stage takes patch ``patch_id`` (see the module docstring)."""
        if not isinstance(patch_id, str) or not patch_id:
            raise WorkflowDefinitionError(f"patched() needs a non-empty patch id, got {patch_id!r}")
        args = {"patch": patch_id}
        with self._lock:
            known = self._patches.get(patch_id)
            if known is not None:
                return known
            if self.failure is not None:
                raise self.failure
            index = self._next_index
            rec = self._at_index.get(index)
            if rec is None:
                taken = index >= self._recorded_end  # new territory: this run reaches it on new code
            else:  # the marker of this very patch, or a run recorded before the patch existed
                taken = (rec.call_id == f"{self.stage}/{PATCHED.name}/{index}"
                         and rec.request_hash in (None, sha256_hex(canonical_json(args))))
            self._patches[patch_id] = taken
            if taken:
                self._next_index += 1
        if taken:
            yield from self._call_steps(PATCHED, index, args)
        return taken
