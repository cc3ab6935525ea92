"""The documented install line of the OpenAI Agents SDK integration works as documented: the extra it
names exists in pyproject.toml and brings the SDK (``openai-agents``, module ``agents``), the test
extra brings the same SDK (the integration's tests run in CI), the installed SDK satisfies the
extra's range and gives the module ``runlog.producers.openai_agents`` imports, and the ImportError raised
without it names that extra."""

from __future__ import annotations

import importlib
import re
import sys
import tomllib
from importlib.metadata import PackageNotFoundError, packages_distributions, version
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
HOW_TO = ROOT / "docs/how-to/openai-agents.md"
EXTRA = re.compile(r"""runlog\[([^\]]+)\]""")
SDK = "openai-agents"


def _extras() -> dict[str, list[Requirement]]:
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return {k: [Requirement(r) for r in v] for k, v in data["project"]["optional-dependencies"].items()}


def _first_install_line() -> str:
    return next(line for line in HOW_TO.read_text().splitlines() if line.startswith("pip install"))


def _sdk_requirement(extra: str) -> Requirement:
    [req] = [r for r in _extras()[extra] if r.name == SDK]
    return req


def test_the_how_tos_install_line_names_an_extra_that_brings_the_sdk() -> None:
    line = _first_install_line()
    [named] = EXTRA.findall(line.split("#", 1)[0])
    assert named == "openai-agents", line
    assert named in _extras(), f"{line!r} names the extra {named!r}, not in pyproject.toml"
    assert _sdk_requirement(named).specifier, "the extra pins a range of the SDK"


def test_the_test_extra_brings_the_same_sdk_range() -> None:
    assert _sdk_requirement("test").specifier == _sdk_requirement("openai-agents").specifier


def test_the_installed_sdk_is_in_the_extras_range_and_gives_the_agents_module() -> None:
    try:
        installed = version(SDK)
    except PackageNotFoundError:
        pytest.skip("openai-agents is not installed (the test extra installs it)")
    assert _sdk_requirement("openai-agents").specifier.contains(installed), installed
    assert SDK in packages_distributions().get("agents", []), "the SDK's module is 'agents'"


def test_the_import_error_without_the_sdk_names_the_documented_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "runlog.producers.openai_agents", raising=False)
    monkeypatch.setitem(sys.modules, "agents", None)  # type: ignore[arg-type]
    with pytest.raises(ImportError) as info:
        importlib.import_module("runlog.producers.openai_agents")
    [named] = EXTRA.findall(str(info.value))
    assert f"runlog[{named}]" in _first_install_line()
