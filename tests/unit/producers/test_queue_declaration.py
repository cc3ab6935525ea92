"""A queue as an App declares it: its limits and weights are checked when declared, a queue declared
twice is refused, an undeclared one has no caps and weighs every tenant 1."""

from __future__ import annotations

from typing import Any

import pytest

from runlog import App, DictInputSource, Queue
from runlog.schemas import ConfigError, WorkflowDefinitionError


@pytest.mark.parametrize("kwargs", [
    {"name": ""}, {"name": "a{b}"}, {"name": "a|b"}, {"name": "q", "concurrency": 0},
    {"name": "q", "per_tenant": -1}, {"name": "q", "concurrency": True}, {"name": "q", "per_tenant": 1.5},
    {"name": "q", "weights": {"t": 0}}, {"name": "q", "weights": {"t": "2"}},
    {"name": "q", "default_weight": -1},
])
def test_a_bad_queue_is_refused_when_declared(kwargs: dict[str, Any]) -> None:
    with pytest.raises(WorkflowDefinitionError):
        Queue(**kwargs)


def test_an_app_declares_its_queues_and_knows_the_undeclared_ones() -> None:
    q = Queue("default", concurrency=50, per_tenant=10, weights={"big": 2})
    app = App.of([], [], DictInputSource({}), queues=[q, Queue("batch", concurrency=5)])
    assert app.queue("default") is q and app.queue("batch").concurrency == 5
    other = app.queue("elsewhere")
    assert (other.concurrency, other.per_tenant, other.weight("anyone")) == (None, None, 1.0)
    assert (q.weight("big"), q.weight("small")) == (2.0, 1.0)
    with pytest.raises(ConfigError, match="declared twice"):
        App.of([], [], DictInputSource({}), queues=[Queue("a"), Queue("a")])
