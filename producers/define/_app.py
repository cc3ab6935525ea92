"""The application object a resumer (and the console's retry) needs: workflows, tools, inputs (pure)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runlog.producers.define._inputs import InputSource
from runlog.producers.define._prices import Price, PriceTable
from runlog.producers.define._queues import Queue
from runlog.producers.define._schedule import Schedule, parse_every
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
    schedules: list[Schedule] = field(default_factory=list, compare=False)
    """The schedules the App declares (:meth:`schedule`); its resumer members record them on the log."""
    queues: tuple[Queue, ...] = ()
    """The queues its workers take submitted runs from (:class:`~runlog.producers.Queue`: the fleet's
    concurrency, per tenant, the tenants' weights); a queue a submission names that is not declared
    here has no cap but the workers' own ``--concurrency`` and weighs every tenant 1."""

    def __post_init__(self) -> None:
        from runlog.schemas.errors import ConfigError

        object.__setattr__(self, "prices", PriceTable.of(self.prices))
        object.__setattr__(self, "queues", tuple(self.queues))
        names = [q.name for q in self.queues]
        if len(set(names)) != len(names):
            raise ConfigError(f"a queue is declared twice: {sorted(n for n in names if names.count(n) > 1)}")

    def queue(self, name: str) -> Queue:
        """The declared queue ``name``, or an undeclared one with no caps."""
        return next((q for q in self.queues if q.name == name), None) or Queue(name)

    @classmethod
    def of(cls, workflows: Iterable[Workflow], tools: Iterable[Tool], source: InputSource, *,
           name: str | None = None, prices: Mapping[str, Price] | None = None,
           queues: Iterable[Queue] = ()) -> App:
        return cls(WorkflowRegistry(workflows), {t.name: t for t in tools}, source, name,
                   PriceTable.of(prices), queues=tuple(queues))

    def schedule(self, name: str, *, workflow: str, params: Mapping[str, Any] | None = None,
                 cron: str | None = None, every: str | float | None = None,
                 catch_up: str = "one") -> Schedule:
        """Declare a schedule: a run of ``workflow`` with ``params`` on every tick of ``cron`` (5
        fields, UTC: ``"0 2 * * *"``) or ``every`` (a period: ``"10m"``, ``"2s"``, seconds). The
        App's resumer members (``runlog resumer``) record it on the log when they start (a changed
        declaration replaces it; a pause from ``runlog schedule pause`` stays) and start one run per
        tick, keyed ``schedule:<name>:<tick ms>``. ``catch_up``: what a tick missed while no member
        ran becomes (``one``: the latest missed tick runs, ``all``: each one, ``none``: skipped).

        Raises:
            ConfigError: a bad name, clock or policy, or a workflow this App does not register.
        """
        from runlog.schemas.errors import ConfigError

        if workflow not in self.registry.names():
            raise ConfigError(f"schedule {name!r}: this App registers no workflow {workflow!r}")
        s = Schedule(name, workflow, dict(params or {}), cron=cron,
                     every=None if every is None else parse_every(every), catch_up=catch_up)
        if any(d.name == name for d in self.schedules):
            raise ConfigError(f"schedule {name!r} is declared twice")
        self.schedules.append(s)
        return s
