"""A run's family for operators: its parent (a child run's ``parent_run_id`` and call) and the tree of child
runs it started (``ctx.start_child``), with what the tree spent.

Usage rolls up twice over. On the log: when a parent records a child's outcome, the event carries
what the child spent in all (``runlog.usage.child``), so the parent's own state counts it
(:attr:`~runlog.projections.RunState.children_usage`, in its ``total_usage`` and against its budget),
once. By reading, for the children still under way: a run's ``with_children`` is its
``total_usage`` plus, for each child whose outcome it has not recorded yet, that child's
``with_children`` as its state tells now (what it has spent so far); a child already recorded is not
added again.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runlog.projections import RunState
from runlog.projections.internal import UsageTotals

__all__ = ["MAX_DEPTH", "ChildNode", "child_tree"]

MAX_DEPTH = 8
"""How deep :func:`child_tree` follows children of children."""


@dataclass
class ChildNode:
    """One run of the tree: its state (None: not on the log yet) and its children's nodes."""

    run_id: str
    state: RunState | None
    children: list[ChildNode] = field(default_factory=list)

    @property
    def with_children(self) -> UsageTotals:
        """What this run and every run under it spent (see the module docstring)."""
        total = self.state.total_usage if self.state is not None else UsageTotals()
        recorded = self.state.children_usage if self.state is not None else {}
        for c in self.children:
            if c.run_id not in recorded:  # recorded ones are in total_usage already
                total = total.plus(c.with_children)
        return total

    def to_dict(self) -> dict[str, Any]:
        s = self.state
        return {"run_id": self.run_id, "workflow": s.workflow_name if s else None,
                "status": s.status.value if s else None, "parent_call": s.parent_call if s else None,
                "usage": s.total_usage.to_dict() if s else None,
                "with_children": self.with_children.to_dict(),
                "children": [c.to_dict() for c in self.children]}

    def lines(self, depth: int = 0) -> list[str]:
        """``runlog show``'s lines for the children under this run (indented by depth)."""
        out: list[str] = []
        for c in self.children:
            s = c.state
            what = f"{s.workflow_name}@{s.workflow_version}  {s.status.value}" if s else "not on the log yet"
            call = f"  ({s.parent_call})" if s and s.parent_call else ""
            spent = c.with_children
            usage = f"  usage {spent.describe()}" if spent.calls else ""
            out.append(f"{'  ' * (depth + 1)}{c.run_id}  {what}{call}{usage}")
            out += c.lines(depth + 1)
        return out


def child_tree(state: RunState, load: Callable[[str], RunState | None], *,
               depth: int = MAX_DEPTH) -> ChildNode:
    """The tree of child runs under ``state``; ``load`` reads a run's state (projection, else log)."""
    seen = {state.run_id}

    def node(run_id: str, st: RunState | None, left: int) -> ChildNode:
        n = ChildNode(run_id, st)
        if st is None or left <= 0:
            return n
        for child in st.children:
            if child in seen:
                continue
            seen.add(child)
            n.children.append(node(child, load(child), left - 1))
        return n

    return node(state.run_id, state, depth)
