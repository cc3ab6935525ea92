"""The examples the docs say run do run: every page's ``run`` and ``file`` blocks, in order, in a
working directory of its own, against the real Kafka and Redis in a private namespace (the
``topics`` fixture: its own topic and Redis prefixes, topics created, all removed afterwards).
The marker convention is in ``tests/docs/_examples.py`` and docs/testing.md."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runlog.schemas.settings import Settings
from tests.docs._examples import ROOT, Block, blocks, pages

pytestmark = pytest.mark.integration

RUNNABLE = [p for p in pages() if any(b.kind == "run" for b in blocks(p))]


def _env(settings: Settings) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNLOG_")}
    env.update(settings.to_env())
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = str(ROOT)
    return env


def _run(block: Block, cwd: Path, env: dict[str, str], n: int) -> None:
    if block.lang == "python":
        script = cwd / f"_example_{n}.py"
        script.write_text(block.code)
        cmd = [sys.executable, script.name]
    elif block.lang in ("sh", "bash"):
        cmd = ["bash", "-e", "-c", block.code]
    else:
        raise AssertionError(f"{block.where}: a run block must be python or sh, not {block.lang!r}")
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, (
        f"{block.where}: exit {proc.returncode}\n--- stdout\n{proc.stdout}\n--- stderr\n{proc.stderr}")


def test_some_pages_have_examples_that_run() -> None:
    names = {p.relative_to(ROOT).as_posix() for p in RUNNABLE}
    assert {"README.md", "docs/getting-started.md"} <= names, names


def test_the_readme_example_runs_twice_in_a_row(topics: Settings, tmp_path: Path) -> None:
    """The second run of the README's example starts with the same key: it gets the first run's
    outcome back (completed, its outputs), and the message is not sent again."""
    from tests.docs._examples import README

    [block] = [b for b in blocks(README) if b.kind == "run" and b.lang == "python"]
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = _env(topics)
    _run(block, cwd, env, 1)
    _run(block, cwd, env, 2)
    assert len(list((cwd / "outbox").iterdir())) == 1


@pytest.mark.parametrize("page", RUNNABLE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_examples_of_a_page_run(page: Path, topics: Settings, tmp_path: Path) -> None:
    cwd = tmp_path / "work"
    cwd.mkdir()
    env = _env(topics)
    ran = 0
    for block in blocks(page):
        if block.kind == "file":
            assert block.arg, f"{block.where}: a file block needs a name"
            (cwd / block.arg).write_text(block.code)
        elif block.kind == "run":
            ran += 1
            _run(block, cwd, env, ran)
    assert ran > 0
