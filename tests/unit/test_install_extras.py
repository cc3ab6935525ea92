"""The documented install lines work as documented (issue 26, item 5): every extra they name exists in
pyproject.toml, and the line given for the Pydantic AI agent example brings the model provider of the
example's model (``Agent("openai:...")`` needs ``pydantic-ai-slim[openai]``: the ``pydantic-ai``
extra alone has no provider, and the example failed with an ImportError)."""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
DOCS = ["README.md", "docs/getting-started.md", "docs/how-to/pydantic-ai.md"]
AGENT_DOC = "docs/how-to/pydantic-ai.md"
EXTRAS_OF = re.compile(r"""(?:(?<=["'\s])runlog|(?<=["'])\.)\[([^\]]+)\]""")
MODEL = re.compile(r"""Agent\(\s*["']([\w-]+):[^"']+["']""")
PROVIDER_EXTRA = {"google-gla": "google", "google-vertex": "google"}
"""Pydantic AI model-name prefixes whose provider extra has another name."""


def _extras() -> dict[str, list[Requirement]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {k: [Requirement(r) for r in v] for k, v in data["project"]["optional-dependencies"].items()}


def _install_lines(doc: str) -> list[str]:
    return [line for line in (ROOT / doc).read_text().splitlines() if "pip install" in line]


def _named(line: str) -> list[str]:
    return [x.strip() for group in EXTRAS_OF.findall(line.split("#", 1)[0]) for x in group.split(",")]


def _provider(doc: str) -> str:
    [prefix] = set(MODEL.findall((ROOT / doc).read_text()))
    return PROVIDER_EXTRA.get(prefix, prefix)


@pytest.mark.parametrize("doc", DOCS)
def test_every_extra_an_install_line_names_exists(doc: str) -> None:
    extras = _extras()
    lines = _install_lines(doc)
    assert lines, f"{doc} has no install line"
    for line in lines:
        for name in _named(line):
            assert name in extras, f"{doc}: {line.strip()!r} names the extra {name!r}, not in pyproject.toml"


@pytest.mark.parametrize("doc", ["README.md", "docs/getting-started.md", AGENT_DOC])
def test_the_first_install_line_brings_the_agent_examples_model_provider(doc: str) -> None:
    provider = _provider(AGENT_DOC)
    assert provider == "openai"  # the example asks "openai:gpt-5.2"
    extras = _extras()
    first = next(line for line in _install_lines(doc) if _named(line))
    brought = [r for name in _named(first) for r in extras[name] if r.name == "pydantic-ai-slim"]
    assert any(provider in r.extras for r in brought), (
        f"{doc}: {first.strip()!r} installs {[str(r) for r in brought] or 'no Pydantic AI'}, without the "
        f"{provider!r} provider the example's model needs (pydantic-ai-slim[{provider}])")
    # the pydantic-ai extra alone is Pydantic AI without a provider: the documented line must say more
    assert not any(provider in r.extras for r in extras["pydantic-ai"])


def test_pydantic_ai_names_the_provider_extra_as_the_docs_do() -> None:
    """Pydantic AI's own metadata has the provider extra the docs name, and it brings the SDK."""
    try:
        reqs = [Requirement(r) for r in requires("pydantic-ai-slim") or []]
    except PackageNotFoundError:
        pytest.skip("pydantic-ai-slim is not installed (the test extra installs it)")
    provider = _provider(AGENT_DOC)
    sdks = {r.name for r in reqs if r.marker is not None and r.marker.evaluate({"extra": provider})}
    assert "openai" in sdks
