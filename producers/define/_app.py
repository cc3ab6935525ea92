"""The application object a resumer (and the console's retry) needs: workflows, tools, inputs (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from runlog.producers.define._inputs import InputSource
from runlog.producers.define._prices import Price, PriceTable
from runlog.producers.define._tools import Tool
from runlog.producers.define._workflow import Workflow, WorkflowRegistry

__all__ = ["App"]


@dataclass(frozen=True)
class App:
    """What resume needs from an application: its workflows, its tools, its inputs, its prices.

    An application module exposes one (``runlog resumer --app module:attribute``).
    ``name`` names the application's resumer group (``<RUNLOG_RESUMER_GROUP>.<name>``);
    without it the group is named by a hash of the registered workflow names
    (:func:`runlog.processors.resume.app_id`). ``prices`` prices the model calls its runs record (model
    name -> :class:`~runlog.producers.Price`, US dollars per million tokens): a call of a model without a
    price records its tokens and no cost. Runners take it (``Runner.from_settings(settings,
    prices=app.prices)``); the resumer and ``runlog branch`` use the App's.
    """

    registry: WorkflowRegistry
    tools: Mapping[str, Tool]
    source: InputSource
    name: str | None = None
    prices: PriceTable = field(default_factory=PriceTable)

    def __post_init__(self) -> None:
        object.__setattr__(self, "prices", PriceTable.of(self.prices))

    @classmethod
    def of(cls, workflows: Iterable[Workflow], tools: Iterable[Tool], source: InputSource, *,
           name: str | None = None, prices: Mapping[str, Price] | None = None) -> App:
        return cls(WorkflowRegistry(workflows), {t.name: t for t in tools}, source, name,
                   PriceTable.of(prices))
