"""No import cycle among Runlog's modules: every ``import`` counts, at module level, inside a
function (deferred) and under ``if TYPE_CHECKING:`` alike, since each is a dependency of one module
on another. ``from package import submodule`` is a dependency on the submodule (the package's
``__init__`` is run by any import of its submodules, which is no dependency of design)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "producers", "processors", "projections")  # runlog.<package>, each a folder at the top


def _modules() -> dict[str, Path]:
    """Every module of ``runlog``: the root's own files and the four packages' (linked under ``runlog/``)."""
    out: dict[str, Path] = {}
    files = [f for f in (ROOT / "runlog").glob("*.py")]
    files += [f for pkg in PACKAGES for f in (ROOT / pkg).rglob("*.py")]
    files += [f for f in (ROOT / "runlog").glob("*/**/*.py")
              if f.relative_to(ROOT / "runlog").parts[0] not in PACKAGES]
    for f in files:
        rel = f.relative_to(ROOT / "runlog") if f.is_relative_to(ROOT / "runlog") else f.relative_to(ROOT)
        parts = ("runlog", *rel.with_suffix("").parts)
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        out[name] = f
    return out


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    found: set[str] = set()
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.add(sub if sub in known else base)
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = _modules()
    known = set(mods)
    return {name: _imports(name, path, known) for name, path in mods.items()}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(g[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(g):
        if v not in index:
            visit(v)
    return out


def test_the_graph_sees_the_imports_it_should() -> None:
    g = graph()
    assert "runlog.producers.log._session" in g["runlog.producers.calls._call_steps"]  # a module-level import
    assert "runlog.schemas._registry_client" in g["runlog.schemas._codec"]  # a deferred one, inside a method
    assert "runlog.processors.console._actions" in g["runlog.processors.console._app"]  # package: module
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle() -> None:
    assert cycles(graph()) == []
