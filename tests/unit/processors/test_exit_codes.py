"""Exit codes are defined once (``runlog.processors.cli.codes``) and every command module uses those."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

from runlog.processors import cli
from runlog.processors.cli import codes as _exit

COMMANDS = [*cli._COMMAND_MODULES, "runlog.processors.cli"]


def test_the_values() -> None:
    assert (_exit.EXIT_OK, _exit.EXIT_FOUND, _exit.EXIT_USAGE, _exit.EXIT_UNAVAILABLE) == (0, 1, 2, 3)
    assert _exit.EXIT_REFUSED == _exit.EXIT_FOUND


def _assigned(tree: ast.Module) -> set[str]:
    names: set[str] = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            names |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


@pytest.mark.parametrize("name", COMMANDS)
def test_each_command_module_imports_the_shared_codes(name: str) -> None:
    mod = importlib.import_module(name)
    used = {n for n in dir(mod) if n.startswith("EXIT_")}
    assert used, f"{name} uses no exit code"
    assert all(getattr(mod, n) is getattr(_exit, n) for n in used)
    redefined = {n for n in _assigned(ast.parse(Path(mod.__file__ or "").read_text("utf-8")))
                 if n.startswith("EXIT_")}
    assert not redefined, f"{name} defines {sorted(redefined)} itself"
