"""MkDocs hook: the reference pages' generated parts, rendered from the code at build time.

A page asks for a part with a marker on a line of its own, ``<!-- generated: NAME -->``:

* ``cli``: every ``runlog`` command, from the parser ``runlog.processors.cli.build_parser`` builds (its
  ``--help`` text, subcommands included), so the reference cannot drift from the parser;
* ``env-vars``: every environment variable, its default and meaning, from
  ``runlog.schemas.settings.ENV_VARS``;
* ``avro``: every record of ``schemas/avro/*.avsc`` with its fields, types, defaults and docs.

The same functions are what the tests read (``tests/unit/docs/``), so a command or a variable
that the code has and these pages lack fails a test too.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
#: a generated part as committed: its opening marker, the text last generated, its closing marker
MARKER = re.compile(r"^<!-- generated: ([a-z-]+) -->\n(.*?)^<!-- end generated: \1 -->$",
                    re.MULTILINE | re.DOTALL)
PAGES = ("reference/cli.md", "reference/configuration.md", "reference/contract.md")


# -- the CLI --------------------------------------------------------------------------------------


def commands(parser: argparse.ArgumentParser | None = None,
             path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], str, argparse.ArgumentParser]]:
    """(command path, one-line help, parser) of every command and subcommand, depth first."""
    if parser is None:
        from runlog.processors.cli import build_parser

        parser = build_parser()
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            for name, sub in action.choices.items():
                yield (*path, name), helps.get(name, ""), sub
                yield from commands(sub, (*path, name))


def cli_markdown() -> str:
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"  # argparse wraps its help to the terminal's width
    try:
        out = []
        for path, help_, parser in commands():
            out.append(f"{'#' * min(len(path) + 1, 4)} runlog {' '.join(path)}\n")
            if help_:
                out.append(f"{help_[0].upper()}{help_[1:]}.\n" if not help_.endswith(".") else f"{help_}\n")
            out.append(f"```text\n{parser.format_help().rstrip()}\n```\n")
        return "\n".join(out)
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old


# -- configuration --------------------------------------------------------------------------------


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def env_markdown() -> str:
    from runlog.schemas.settings import ENV_VARS

    rows = ["| variable | default | meaning |", "|---|---|---|"]
    for name, default, meaning in ENV_VARS:
        rows.append(f"| `{name}` | {f'`{default}`' if default else '(unset)'} | {_cell(meaning)} |")
    return "\n".join(rows) + "\n"


# -- the Avro contract ----------------------------------------------------------------------------


def _type(t: Any) -> str:
    if isinstance(t, str):
        return t
    if isinstance(t, list):
        return " \\| ".join(_type(x) for x in t)
    kind = t.get("type")
    if kind in ("record", "enum", "fixed"):
        return f"{t.get('namespace', 'runlog')}.{t['name']}" if "." not in t["name"] else t["name"]
    if kind == "array":
        return f"array&lt;{_type(t['items'])}&gt;"
    if kind == "map":
        return f"map&lt;{_type(t['values'])}&gt;"
    if "logicalType" in t:
        return f"{t['type']} ({t['logicalType']})"
    return _type(kind)


def _named(t: Any) -> Iterator[dict[str, Any]]:
    """Every record and enum defined inside a schema, outermost first."""
    if isinstance(t, list):
        for x in t:
            yield from _named(x)
    elif isinstance(t, dict):
        if t.get("type") in ("record", "enum"):
            yield t
        for f in t.get("fields", []):
            yield from _named(f["type"])
        for k in ("items", "values"):
            if k in t:
                yield from _named(t[k])


def avro_markdown() -> str:
    out = []
    for path in sorted((ROOT / "schemas" / "avro").glob("*.avsc")):
        schema = json.loads(path.read_text())
        out.append(f"### `{path.name}`\n")
        seen: set[str] = set()
        for t in _named(schema):
            if t["name"] in seen:
                continue
            seen.add(t["name"])
            out.append(f"**`{t.get('namespace', 'runlog')}.{t['name']}`** ({t['type']})"
                       + (f": {_cell(t['doc'])}" if t.get("doc") else "") + "\n")
            if t["type"] == "enum":
                out.append("symbols: " + ", ".join(f"`{s}`" for s in t["symbols"])
                           + (f" (default `{t['default']}`)" if "default" in t else "") + "\n")
                continue
            rows = ["| field | type | default | doc |", "|---|---|---|---|"]
            for f in t["fields"]:
                default = f"`{json.dumps(f['default'])}`" if "default" in f else ""
                rows.append(f"| `{f['name']}` | {_type(f['type'])} | {default} | {_cell(f.get('doc', ''))} |")
            out.append("\n".join(rows) + "\n")
    return "\n".join(out)


GENERATORS: dict[str, Callable[[], str]] = {"cli": cli_markdown, "env-vars": env_markdown,
                                             "avro": avro_markdown}


def render(markdown: str) -> str:
    """``markdown`` with every generated part generated anew between its markers; an unknown part
    is an error."""
    def fill(m: re.Match[str]) -> str:
        if m.group(1) not in GENERATORS:
            raise ValueError(f"unknown generated part {m.group(1)!r}")
        return (f"<!-- generated: {m.group(1)} -->\n{GENERATORS[m.group(1)]().rstrip()}\n"
                f"<!-- end generated: {m.group(1)} -->")

    return MARKER.sub(fill, markdown)


def on_page_markdown(markdown: str, **_: Any) -> str:
    return render(markdown)


def stale() -> list[str]:
    """The pages whose committed generated parts differ from what the code generates now."""
    docs = ROOT / "docs"
    return [page for page in PAGES if render((docs / page).read_text()) != (docs / page).read_text()]


if __name__ == "__main__":  # python docs/_hooks/generate.py --write: the committed pages made current
    import sys

    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python docs/_hooks/generate.py --write")
    for page in PAGES:
        path = ROOT / "docs" / page
        path.write_text(render(path.read_text()))
        print(f"wrote {path.relative_to(ROOT)}")
