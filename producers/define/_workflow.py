"""Workflow definitions: ordered stages with declared inputs and named verification rules.

Pure: a :class:`Workflow` is plain Python objects; :meth:`Workflow.spec` is what
``RUN_STARTED`` records so any consumer can compute ``next_stage`` from the log.

Example::

    wf = Workflow("content", version="1")

    @wf.stage("research", inputs=["sources"],
              rules=[rule("results.count >= 3", lambda out: len(out["results"]) >= 3)])
    def research(ctx, inputs):
        return {"results": ctx.call(search, q=ctx.params["topic"])}
"""

from __future__ import annotations

import hashlib
import inspect
import json
import re
import types
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

from runlog.schemas import RuleResult, StageSpec, WorkflowSpec
from runlog.schemas.errors import WorkflowDefinitionError

if TYPE_CHECKING:
    from runlog.producers.define._budget import Budget

__all__ = ["Rule", "Stage", "StageFn", "Workflow", "WorkflowRegistry", "evaluate_rules", "rule"]

StageFn = Callable[..., Mapping[str, Any]] | Callable[..., Awaitable[Mapping[str, Any]]]
"""A stage: ``fn(ctx, inputs) -> output`` (a JSON object), where ``ctx`` is a
:class:`~runlog.producers.StageContext`, or ``async def fn(ctx, inputs)`` awaited for it (its ``ctx`` is an
:class:`~runlog.producers.AsyncStageContext`). Spelled with ``...`` so that this module, which the
context's modules import, does not import them back; the runner checks the arity at definition."""
_F = TypeVar("_F", bound=StageFn)

_NAME = re.compile(r"^[A-Za-z0-9_.\-]+$")


def _check_name(kind: str, name: str) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise WorkflowDefinitionError(
            f"{kind} name {name!r} must be non-empty letters, digits, '_', '-' or '.'"
        )


@dataclass(frozen=True)
class Rule:
    """A named predicate over a stage's output. ``check`` returns a bool, or
    ``(bool, detail)`` to say why."""

    name: str
    check: Callable[[Mapping[str, Any]], bool | tuple[bool, str]]


def rule(name: str, check: Callable[[Mapping[str, Any]], bool | tuple[bool, str]]) -> Rule:
    """Declare a verification rule, e.g. ``rule("image.count == 3", lambda o: len(o["images"]) == 3)``."""
    if not name:
        raise WorkflowDefinitionError("a rule needs a name")
    if not callable(check):
        raise WorkflowDefinitionError(f"rule {name!r}: check must be callable")
    return Rule(name, check)


def evaluate_rules(rules: Iterable[Rule], output: Mapping[str, Any]) -> list[RuleResult]:
    """Every rule's result, in order. A rule that raises or returns a non-bool fails
    (with the reason as detail) instead of aborting the others."""
    results = []
    for r in rules:
        try:
            got = r.check(output)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, ArithmeticError) as err:
            results.append(RuleResult(r.name, False, f"raised {type(err).__name__}: {err}"))
            continue
        detail: str | None = None
        if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], str):
            got, detail = got
        if isinstance(got, bool):
            results.append(RuleResult(r.name, got, detail if detail else (None if got else "false")))
        else:
            results.append(RuleResult(r.name, False, f"returned {type(got).__name__}, not bool"))
    return results


@dataclass(frozen=True)
class Stage:
    """One step of a workflow."""

    name: str
    fn: StageFn
    inputs: tuple[str, ...] = ()
    rules: tuple[Rule, ...] = ()
    checkpoint: bool = True

    def spec(self) -> StageSpec:
        return StageSpec(self.name, self.inputs, tuple(r.name for r in self.rules), self.checkpoint)

    def fingerprint(self) -> str:
        """16 hex digits that change when the stage's definition changes: its name, inputs, rules and
        checkpoint flag, the bytecode of its function and of its rules' checks (constants and names
        included, not line numbers or comments). Code the stage calls is not covered, and another
        Python version compiles other bytecode (the stage then counts as changed)."""
        h = hashlib.sha256()
        h.update(json.dumps([self.name, list(self.inputs), [r.name for r in self.rules], self.checkpoint],
                            separators=(",", ":")).encode())
        for fn in (self.fn, *(r.check for r in self.rules)):
            h.update(b"\x00")
            _feed_code(h, fn)
        return h.hexdigest()[:16]


class Workflow:
    """A named, versioned, ordered list of stages (declared in order with :meth:`stage`)."""

    def __init__(self, name: str, version: str, *, budget: Budget | None = None) -> None:
        _check_name("workflow", name)
        if not version:
            raise WorkflowDefinitionError(f"workflow {name!r} needs a version")
        self.name = name
        self.version = version
        self.budget = budget
        """What each run's model calls may spend (:class:`~runlog.producers.Budget`); a run's own wins."""
        self._stages: list[Stage] = []

    def stage(self, name: str, *, inputs: Sequence[str] = (), rules: Sequence[Rule] = (),
              checkpoint: bool = True) -> Callable[[_F], _F]:
        """Decorator adding ``fn(ctx, inputs) -> dict`` (or an ``async def`` one) as the next stage."""

        def deco(fn: _F) -> _F:
            self.add_stage(Stage(name, fn, tuple(inputs), tuple(rules), checkpoint))
            return fn

        return deco

    def add_stage(self, stage: Stage) -> None:
        _check_name("stage", stage.name)
        if any(s.name == stage.name for s in self._stages):
            raise WorkflowDefinitionError(f"workflow {self.name!r}: stage {stage.name!r} declared twice")
        for i in stage.inputs:
            _check_name(f"stage {stage.name!r} input", i)
        _check_arity(stage)
        names = [r.name for r in stage.rules]
        if len(set(names)) != len(names):
            raise WorkflowDefinitionError(f"stage {stage.name!r}: rule names must be unique")
        self._stages.append(stage)

    @property
    def stages(self) -> tuple[Stage, ...]:
        return tuple(self._stages)

    def get_stage(self, name: str) -> Stage:
        for s in self._stages:
            if s.name == name:
                return s
        raise WorkflowDefinitionError(f"workflow {self.name!r} has no stage {name!r}")

    def input_names(self) -> tuple[str, ...]:
        """Every input any stage reads, sorted (what a run pins at start)."""
        return tuple(sorted({i for s in self._stages for i in s.inputs}))

    def fingerprints(self) -> dict[str, str]:
        """``stage name -> Stage.fingerprint()``: what ``RUN_STARTED`` records (attribute
        ``runlog.stages``) so an upgrade knows which completed stages the new code left unchanged."""
        return {st.name: st.fingerprint() for st in self._stages}

    def spec(self) -> WorkflowSpec:
        if not self._stages:
            raise WorkflowDefinitionError(f"workflow {self.name!r} has no stages")
        return WorkflowSpec(self.name, self.version, tuple(s.spec() for s in self._stages))

    def __repr__(self) -> str:
        return f"Workflow({self.name!r}, version={self.version!r}, stages={[s.name for s in self._stages]})"


def _check_arity(stage: Stage) -> None:
    """A stage is called ``fn(ctx, inputs)``: refuse a function that cannot take exactly that."""
    try:
        inspect.signature(stage.fn).bind(None, {})
    except TypeError:
        raise WorkflowDefinitionError(
            f"stage {stage.name!r}: {getattr(stage.fn, '__qualname__', stage.fn)!r} must take (ctx, inputs)"
        ) from None
    except ValueError:  # no signature to read (some builtins): it is called as it is
        return


class WorkflowRegistry:
    """Workflows by name and version, as an application module exposes them to resume.

    One name may be registered at several versions at once (a rolling deploy serves the old
    version's runs while new runs start on the new one). Resume looks up the workflow named
    *and versioned* in ``RUN_STARTED`` here and refuses to run when the registered definition's
    spec differs from the recorded one; a new run starts on :meth:`get` without a version: the
    newest registered version (versions compared as dotted numbers when they all are, else the
    one registered last).
    """

    def __init__(self, workflows: Iterable[Workflow] = ()) -> None:
        self._by_name: dict[str, dict[str, Workflow]] = {}
        for wf in workflows:
            self.register(wf)

    def register(self, wf: Workflow) -> Workflow:
        versions = self._by_name.setdefault(wf.name, {})
        known = versions.get(wf.version)
        if known is not None and known is not wf:
            raise WorkflowDefinitionError(
                f"workflow {wf.name!r} version {wf.version!r} is already registered (another "
                "definition at the same version: give the new definition a new version)")
        versions[wf.version] = wf
        return wf

    def get(self, name: str, version: str | None = None) -> Workflow:
        """The workflow ``name`` at ``version`` (None: the newest registered version)."""
        versions = self._by_name.get(name)
        if not versions:
            raise WorkflowDefinitionError(f"no workflow named {name!r} is registered")
        if version is None:
            return versions[self.versions(name)[-1]]
        wf = versions.get(version)
        if wf is None:
            served = ", ".join(repr(v) for v in self.versions(name))
            raise WorkflowDefinitionError(
                f"workflow {name!r} is registered at version {served}, not {version!r}")
        return wf

    def versions(self, name: str) -> tuple[str, ...]:
        """The versions of ``name`` registered, oldest first (empty: the name is not registered)."""
        versions = list(self._by_name.get(name, {}))
        keys = [_numeric(v) for v in versions]
        if all(k is not None for k in keys):
            versions.sort(key=lambda v: _numeric(v) or ())
        return tuple(versions)

    def serves(self, name: str, version: str) -> bool:
        """Whether ``name`` is registered at ``version``."""
        return version in self._by_name.get(name, {})

    def served(self) -> tuple[tuple[str, str], ...]:
        """Every registered ``(name, version)``, names sorted, versions oldest first."""
        return tuple((name, v) for name in sorted(self._by_name) for v in self.versions(name))

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __iter__(self) -> Iterator[Workflow]:
        return (wf for versions in self._by_name.values() for wf in versions.values())

    def names(self) -> tuple[str, ...]:
        return tuple(self._by_name)


def _feed_code(h: Any, fn: object) -> None:
    """Feed the bytecode of ``fn`` (unwrapped; a callable object's ``__call__``) into ``h``."""
    target = inspect.unwrap(fn) if callable(fn) else fn
    code = getattr(target, "__code__", None)
    if code is None:
        call = type(target).__dict__.get("__call__")  # a callable object: its class's method
        code = getattr(call, "__code__", None)
    if code is None:
        h.update(repr(getattr(target, "__qualname__", type(target).__qualname__)).encode())
        return
    _feed(h, code)


def _feed(h: Any, code: types.CodeType) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    h.update(repr(code.co_varnames).encode())
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            _feed(h, const)
        else:
            h.update(_const(const).encode())


def _const(c: object) -> str:
    """A constant's text, the same in every process (a frozenset's order depends on string hashing)."""
    if isinstance(c, tuple):
        return "(" + ",".join(_const(x) for x in c) + ")"
    if isinstance(c, frozenset):
        return "frozenset(" + ",".join(sorted(_const(x) for x in c)) + ")"
    return repr(c)


def _numeric(version: str) -> tuple[int, ...] | None:
    """``"1.10.2"`` -> ``(1, 10, 2)``; None when a part is not a number."""
    try:
        return tuple(int(part) for part in version.split("."))
    except ValueError:
        return None
