"""The code examples of README.md and docs/: found, classified and checked.

Every fenced ``python`` block of a page, and every ``sh`` block that is to be run, is preceded by a
marker, an HTML comment on the line above its fence (invisible on the site and on GitHub):

* ``<!-- example: run -->``: executed by ``tests/docs/test_examples.py`` against the real Kafka and
  Redis, in the page's own working directory and a private namespace (topic and Redis prefixes);
  a ``python`` block as a script, an ``sh`` block with ``bash -e``. It must exit 0; its own
  ``assert`` statements say what it claims.
* ``<!-- example: file NAME -->``: written to ``NAME`` in that working directory before the blocks
  after it run (a module the next blocks import, say).
* ``<!-- example: fragment -->``: an excerpt that names things it does not define (a renderer, a
  database). It is compiled and its import statements are executed, so every name it imports
  from Runlog must exist (``tests/unit/docs/test_pages.py``).

A ``python`` block without a marker fails ``tests/unit/docs/test_pages.py``; other languages
(``sh`` without a marker, ``text``) are shown, not run. See docs/testing.md.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"

_FENCE = re.compile(r"^(?P<indent> *)```(?P<lang>[\w+-]*)[^\n]*\n(?P<body>.*?)^(?P=indent)```[ \t]*$",
                    re.MULTILINE | re.DOTALL)
_MARK = re.compile(r"<!-- example: (?P<kind>run|file|fragment)(?: (?P<arg>\S+))? -->\s*$")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    lang: str
    code: str
    kind: str | None  # run, file, fragment; None: unmarked
    arg: str | None  # the file name of a ``file`` block

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def pages() -> list[Path]:
    """README.md and every Markdown page under docs/."""
    return [README, *sorted(p for p in DOCS.rglob("*.md") if "_hooks" not in p.parts)]


def blocks(page: Path) -> list[Block]:
    text = page.read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()].rstrip("\n").rsplit("\n", 1)[-1]
        mark = _MARK.search(before)
        indent = len(m.group("indent"))
        body = "\n".join(line[indent:] for line in m.group("body").split("\n"))
        out.append(Block(page, text.count("\n", 0, m.start()) + 1, m.group("lang"), body,
                         mark.group("kind") if mark else None, mark.group("arg") if mark else None))
    return out


def imports_of(code: str) -> str:
    """The top-level import statements of ``code``, as a module of their own."""
    tree = ast.parse(code)
    return "\n".join(ast.unparse(n) for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom))


def hook() -> ModuleType:
    """``docs/_hooks/generate.py``, the MkDocs hook that renders the generated reference parts."""
    spec = importlib.util.spec_from_file_location("runlog_docs_hook", DOCS / "_hooks" / "generate.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def rendered(page: str) -> str:
    """A page of docs/ as the site shows it: its generated parts filled in by the hook."""
    text: str = hook().render((DOCS / page).read_text())
    return text
