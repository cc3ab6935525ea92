"""Runlog's import graph: no cycle, no import into another package's private modules, no import
running back up a layer.

Every ``import`` counts, at module level, inside a function (deferred) and under
``if TYPE_CHECKING:`` alike, since each is a dependency of one module on another. ``from package
import submodule`` is a dependency on the submodule (the package's ``__init__`` is run by any import
of its submodules, which is no dependency of design).

Boundaries: another package may import a package's public names (its ``__init__``'s ``__all__``, and
its modules without an underscore in their path, by their ``__all__``) and its one declared internal
module, ``runlog.<package>.internal`` (for Runlog's own packages, not a stable API, with an
``__all__`` of its own). Layers: schemas < projections < producers < processors, then the root
(``runlog``, ``python -m runlog``, ``runlog.testing``); inside producers, its sub-packages in
:data:`PRODUCER_LAYERS`; inside processors, its parts import each other without a circle.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("schemas", "projections", "producers", "processors")  # runlog.<package>, lowest layer first
INTERNAL = "internal"  # runlog.<package>.internal: what a package declares for Runlog's other packages
PRODUCER_LAYERS = (("base", "crash"), ("define",), ("log",), ("calls",), ("run",))
"""The layers of ``runlog.producers``, lowest first, by the name under it; any other part (the package's
``__init__``, the integrations, ``streams``, ``otel``) is above them all."""


@dataclass(frozen=True)
class Site:
    """One imported thing: ``module`` itself (``name`` None) or ``name`` from ``module``."""

    importer: str
    module: str
    name: str | None
    line: int


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


def sites(name: str, source: str, known: set[str], *, is_package: bool = False) -> list[Site]:
    """What module ``name`` (whose text is ``source``) imports, among the ``known`` modules."""
    found: list[Site] = []
    package = name if is_package else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(source, name)):
        if isinstance(node, ast.Import):
            found += [Site(name, a.name, None, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for a in node.names:
                sub = f"{base}.{a.name}"
                found.append(Site(name, sub, None, node.lineno) if sub in known
                             else Site(name, base, a.name, node.lineno))
    return [s for s in found if s.module in known and s.module != name]


def all_sites() -> list[Site]:
    mods = _modules()
    known = set(mods)
    return [s for name, path in mods.items()
            for s in sites(name, path.read_text(), known, is_package=path.name == "__init__.py")]


def exports() -> dict[str, frozenset[str] | None]:
    """Each module's ``__all__`` as written at its top level (None: it has none)."""
    out: dict[str, frozenset[str] | None] = {}
    for name, path in _modules().items():
        out[name] = None
        for node in ast.parse(path.read_text(), str(path)).body:
            target = node.target if isinstance(node, ast.AnnAssign) else (
                node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id == "__all__" and node.value is not None:
                out[name] = frozenset(ast.literal_eval(node.value))
    return out


def graph() -> dict[str, set[str]]:
    g: dict[str, set[str]] = {name: set() for name in _modules()}
    for s in all_sites():
        g[s.importer].add(s.module)
    return g


def package_of(module: str) -> str | None:
    """``schemas`` for ``runlog.schemas._types``; None for a module outside the four packages."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "runlog" and parts[1] in PACKAGES else None


def is_private(module: str) -> bool:
    """An underscore in the module's path below its package: ``runlog.producers.log._lease``."""
    return any(p.startswith("_") for p in module.split(".")[2:])


def boundary_violations(found: Iterable[Site], exported: Mapping[str, frozenset[str] | None]) -> list[str]:
    """Imports from another package that go around what it declares: a private module, or a name that
    is not in the imported module's ``__all__`` (or, without one, a name with an underscore)."""
    out: list[str] = []
    for s in sorted(found, key=lambda s: (s.importer, s.line)):
        target = package_of(s.module)
        if target is None or target == package_of(s.importer):
            continue
        where = f"{s.importer}:{s.line}"
        if is_private(s.module):
            out.append(f"{where} imports {s.module}, private to runlog.{target}")
        elif s.name is not None:
            names = exported.get(s.module)
            if (names is None and s.name.startswith("_")) or (names is not None and s.name not in names):
                out.append(f"{where} imports {s.name} from {s.module}, not in its __all__")
    return out


def layer_violations(g: Mapping[str, Iterable[str]], level: Callable[[str], int | None]) -> list[str]:
    """Imports from a module to one of a higher level (modules whose level is None are not compared)."""
    out: list[str] = []
    for a, targets in g.items():
        for b in targets:
            la, lb = level(a), level(b)
            if la is not None and lb is not None and lb > la:
                out.append(f"{a} (level {la}) imports {b} (level {lb})")
    return sorted(out)


def package_level(module: str) -> int:
    """schemas 0 < projections 1 < producers 2 < processors 3 < the root (``runlog``, ``runlog.testing``)."""
    package = package_of(module)
    return PACKAGES.index(package) if package is not None else len(PACKAGES)


def producer_level(module: str) -> int | None:
    """A module's layer in ``runlog.producers`` (None outside it)."""
    if package_of(module) != "producers":
        return None
    part = module.split(".")[2] if module.count(".") >= 2 else ""
    return next((i for i, names in enumerate(PRODUCER_LAYERS) if part in names), len(PRODUCER_LAYERS))


def parts_graph(g: Mapping[str, Iterable[str]], package: str) -> dict[str, set[str]]:
    """The graph of a package's parts (its sub-packages and top modules; ``""``: its ``__init__``)."""
    def part(m: str) -> str:
        return m.split(".")[2] if m.count(".") >= 2 else ""

    out: dict[str, set[str]] = {}
    for a, targets in g.items():
        if package_of(a) == package:
            out.setdefault(part(a), set()).update(
                part(b) for b in targets if package_of(b) == package and part(b) != part(a))
    for targets in list(out.values()):
        for b in targets:
            out.setdefault(b, set())
    return out


def cycles(g: Mapping[str, Iterable[str]]) -> list[list[str]]:
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


def test_each_declared_internal_module_says_what_it_is() -> None:
    mods = _modules()
    exported = exports()
    declared = [f"runlog.{p}.{INTERNAL}" for p in PACKAGES if f"runlog.{p}.{INTERNAL}" in mods]
    assert declared, "no package declares an internal module"
    for name in declared:
        doc = ast.get_docstring(ast.parse(mods[name].read_text())) or ""
        assert "not a stable API" in doc, name
        assert exported[name], f"{name} has no __all__"


def test_no_import_into_another_packages_private_modules() -> None:
    assert boundary_violations(all_sites(), exports()) == []


def test_no_import_runs_back_up_between_packages() -> None:
    assert layer_violations(graph(), package_level) == []


def test_no_import_runs_back_up_inside_producers() -> None:
    g = graph()
    assert {m.split(".")[2] for m in g if m.count(".") >= 2 and package_of(m) == "producers"} >= {
        n for names in PRODUCER_LAYERS for n in names}, "a layer of PRODUCER_LAYERS names no module"
    assert layer_violations(g, producer_level) == []


def test_the_parts_of_processors_import_each_other_without_a_circle() -> None:
    parts = parts_graph(graph(), "processors")
    assert {"cli", "resume", "projector"} <= set(parts)
    assert cycles(parts) == []


def test_the_checks_catch_a_planted_violation() -> None:
    known = {"runlog.schemas", "runlog.schemas._types", "runlog.schemas.internal", "runlog.schemas.settings",
             "runlog.projections.fold", "runlog.producers.run._runner", "runlog.producers.define._tools"}
    exported: dict[str, frozenset[str] | None] = {
        "runlog.schemas": frozenset({"RunEvent"}), "runlog.schemas.internal": frozenset({"now_ms"}),
        "runlog.schemas._types": frozenset({"RunEvent", "now_ms"}), "runlog.schemas.settings": None}
    planted = sites("runlog.projections.fold", "\n".join((
        "from runlog.schemas import RunEvent",  # public: fine
        "from runlog.schemas.internal import now_ms",  # declared internal: fine
        "def later():",
        "    from runlog.schemas._types import RunEvent",  # private module, deferred
        "import runlog.schemas._types",  # private module, plain import
        "from runlog.schemas.internal import STAGES",  # not in the internal module's __all__
        "from runlog.schemas import _hidden",  # not in the package's __all__
        "from runlog.schemas.settings import _env",  # no __all__: an underscore name
    )), known)
    assert boundary_violations(planted, exported) == [
        "runlog.projections.fold:4 imports runlog.schemas._types, private to runlog.schemas",
        "runlog.projections.fold:5 imports runlog.schemas._types, private to runlog.schemas",
        "runlog.projections.fold:6 imports STAGES from runlog.schemas.internal, not in its __all__",
        "runlog.projections.fold:7 imports _hidden from runlog.schemas, not in its __all__",
        "runlog.projections.fold:8 imports _env from runlog.schemas.settings, not in its __all__",
    ]
    own = sites("runlog.schemas.settings", "from runlog.schemas._types import now_ms", known)
    assert boundary_violations(own, exported) == []  # a package's own private modules are its own
    assert layer_violations({"runlog.schemas._types": {"runlog.projections.fold"}}, package_level) == [
        "runlog.schemas._types (level 0) imports runlog.projections.fold (level 1)"]
    assert layer_violations({"runlog.producers.define._tools": {"runlog.producers.run._runner"},
                             "runlog.producers.run._runner": {"runlog.producers.define._tools"}},
                            producer_level) == [
        "runlog.producers.define._tools (level 1) imports runlog.producers.run._runner (level 4)"]
    assert cycles(parts_graph({"runlog.processors.cli.x": {"runlog.processors.resume.y"},
                               "runlog.processors.resume.y": {"runlog.processors.cli.codes"}},
                              "processors")) == [["cli", "resume"]]
