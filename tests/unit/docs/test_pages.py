"""The README is a front door and the docs hold together: the README's length, every relative
link of README.md and docs/ resolves, every Python example is marked (tests/docs/_examples.py),
fragments compile and import only what exists, and the generated references cover every command
and every configuration variable."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from tests.docs._examples import DOCS, README, ROOT, blocks, hook, imports_of, pages, rendered

README_MAX_LINES = 250
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_FENCED = re.compile(r"^ *```.*?^ *```", re.MULTILINE | re.DOTALL)


def _links(page: Path) -> list[str]:
    text = _FENCED.sub("", page.read_text())  # links inside code blocks are code
    text = re.sub(r"`[^`\n]*`", "", text)
    return _LINK.findall(text)


def test_the_readme_is_a_front_door() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines (at most {README_MAX_LINES})"


def test_the_readme_links_into_the_docs() -> None:
    targets = {t for t in _links(README) if t.startswith("docs/")}
    assert {"docs/getting-started.md", "docs/reference/cli.md", "docs/reference/configuration.md"} <= targets


@pytest.mark.parametrize("page", pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_relative_link_points_to_an_existing_file(page: Path) -> None:
    broken = []
    for target in _links(page):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue  # a URL (https:, mailto:) or an anchor on the same page
        path = target.split("#", 1)[0]
        if not (page.parent / path).exists():
            broken.append(target)
    assert not broken, f"{page.relative_to(ROOT)}: links to missing files: {broken}"


def test_the_link_check_finds_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "p.md"
    page.write_text("[ok](p.md) [gone](nope.md#x) `[code](x.md)` [web](https://example.invalid/a)\n")
    assert _links(page) == ["p.md", "nope.md#x", "https://example.invalid/a"]


def test_every_python_example_is_marked() -> None:
    unmarked = [b.where for p in pages() for b in blocks(p) if b.lang in ("python", "py") and b.kind is None]
    assert not unmarked, ("Python examples without a marker (<!-- example: run|file NAME|fragment -->, "
                          f"see docs/testing.md): {unmarked}")


FRAGMENTS = [b for p in pages() for b in blocks(p) if b.kind == "fragment"]


@pytest.mark.parametrize("block", FRAGMENTS, ids=lambda b: b.where)
def test_a_fragment_compiles_and_imports_what_exists(block: object) -> None:
    from tests.docs._examples import Block

    assert isinstance(block, Block)
    compile(block.code, block.where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)  # async excerpts
    exec(compile(imports_of(block.code), block.where, "exec"), {})


def test_fragments_are_a_minority() -> None:
    """Most examples run; a fragment is an excerpt, not a way around running examples."""
    kinds = [b.kind for p in pages() for b in blocks(p) if b.lang == "python"]
    assert kinds.count("run") + kinds.count("file") >= 5, kinds


def test_the_generated_references_are_committed_as_the_code_generates_them() -> None:
    """cli.md, configuration.md and contract.md hold their generated parts in the repository (they
    read whole without a site build), and a command, option or variable that changed fails here."""
    assert hook().stale() == [], "run: python docs/_hooks/generate.py --write"
    assert "usage: runlog resume" in (DOCS / "reference" / "cli.md").read_text()
    assert "| `KAFKA_BOOTSTRAP_SERVERS` |" in (DOCS / "reference" / "configuration.md").read_text()


def test_every_command_has_a_generated_reference() -> None:
    page = rendered("reference/cli.md")
    names = [" ".join(path) for path, _, _ in hook().commands()]
    assert {"init", "demo", "resume", "resumer", "resolve", "approve", "cancel", "retry", "audit",
            "projections rebuild", "console"} <= set(names)
    for name in names:
        assert re.search(rf"^#+ runlog {re.escape(name)}$", page, re.MULTILINE), name
        assert f"usage: runlog {name}" in page, name


def test_the_avro_reference_has_every_schema_file() -> None:
    page = rendered("reference/contract.md")
    for avsc in (ROOT / "schemas" / "avro").glob("*.avsc"):
        assert f"### `{avsc.name}`" in page, avsc.name
    assert "| `seq` | long |" in page


def test_an_unknown_generated_part_is_an_error() -> None:
    with pytest.raises(ValueError, match="nope"):
        hook().render("<!-- generated: nope -->\n<!-- end generated: nope -->\n")


def test_every_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    missing = [p.relative_to(DOCS).as_posix() for p in pages()[1:] if f" {p.relative_to(DOCS).as_posix()}\n"
               not in nav]
    assert not missing, missing
