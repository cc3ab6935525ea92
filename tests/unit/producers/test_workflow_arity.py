"""A stage must take ``(ctx, inputs)``: a function that cannot is refused when it is declared."""

from __future__ import annotations

from typing import Any

import pytest

from runlog.producers import AsyncStageContext, StageContext, Workflow
from runlog.schemas.errors import WorkflowDefinitionError


def test_a_stage_taking_ctx_and_inputs_is_accepted_sync_and_async() -> None:
    wf = Workflow("w", "1")

    @wf.stage("a")
    def a(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {}

    @wf.stage("b")
    async def b(ctx: AsyncStageContext, inputs: dict[str, Any], *, extra: int = 1) -> dict[str, Any]:
        return {}

    assert [s.name for s in wf.stages] == ["a", "b"]


@pytest.mark.parametrize("fn", [
    lambda: {},
    lambda ctx: {},
    lambda ctx, inputs, more: {},
    lambda *, ctx, inputs: {},
])
def test_a_stage_that_cannot_take_ctx_and_inputs_is_refused(fn: Any) -> None:
    wf = Workflow("w", "1")
    with pytest.raises(WorkflowDefinitionError, match="must take \\(ctx, inputs\\)"):
        wf.stage("a")(fn)
    assert wf.stages == ()
