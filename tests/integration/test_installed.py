"""Runlog installed from its wheel, not editable, beside an application of its own with the generic
module names Runlog's folders have in the repository (``schemas.py``, ``processors/``, ``projections.py``).

One wheel is built from a copy of the working tree and installed into a fresh virtualenv that reaches
the shared virtualenv's dependencies through a path file (its own site-packages comes first, and the
shared one's editable-install hook is not run: only the wheel's ``runlog`` can be imported). Then, in
the application's working directory: the tutorial's workflow crashes and resumes in memory
(:mod:`runlog.testing`) and against Kafka and Redis (the tutorial's own commands), ``runlog --help``
and ``runlog --version`` work, and outside it ``import schemas`` finds nothing."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

import pytest

from runlog.schemas.settings import Settings
from tests.docs._examples import DOCS, ROOT, blocks

pytestmark = pytest.mark.integration

TUTORIAL = DOCS / "getting-started.md"

USER_FILES = {
    "schemas.py": '"""The application\'s own request models."""\n\n\nclass Greeting:\n'
                  '    KIND = "user-schemas"\n',
    "processors/__init__.py": '"""The application\'s own processors."""\n\nKIND = "user-processors"\n',
    "projections.py": '"""The application\'s own projections."""\n\nKIND = "user-projections"\n',
}


@dataclass(frozen=True)
class Installed:
    venv: Path
    bin: Path
    python: Path


def _clean_env(extra: dict[str, str] | None = None, *, bin_dir: Path | None = None) -> dict[str, str]:
    """The environment without PYTHONPATH (the repository must not be importable) or Runlog settings."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("RUNLOG_")}
    if bin_dir is not None:
        env["PATH"] = f"{bin_dir}{os.pathsep}{env.get('PATH', '')}"
    env.update(extra or {})
    return env


def _run(cmd: list[str], cwd: Path, env: dict[str, str],
         timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False)


def _ok(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 0, f"{proc.args}: exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Installed]:
    base = tmp_path_factory.mktemp("installed")
    src = base / "src"  # a copy: building in the working tree would leave build/ and egg-info behind
    shutil.copytree(ROOT, src, symlinks=True, ignore=shutil.ignore_patterns(
        ".git", ".runlog", ".mypy_cache", ".ruff_cache", "__pycache__", "*.egg-info", "build", "*-data"))
    wheels = base / "wheels"
    env = _clean_env()
    pip = [sys.executable, "-m", "pip"]
    _ok(_run([*pip, "wheel", "--no-deps", "-q", "-w", str(wheels), str(src)], base, env))
    [wheel] = wheels.glob("runlog-*.whl")
    venv = base / "venv"
    _ok(_run([sys.executable, "-m", "venv", "--without-pip", str(venv)], base, env))
    python = venv / "bin" / "python"
    site = Path(_ok(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                         base, env)).strip())
    # the dependencies, from the shared virtualenv: a path entry after the venv's own site-packages
    (site / "_shared_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    _ok(_run([*pip, "--python", str(python), "install", "-q", "--no-deps", "--no-index", "--force-reinstall",
              str(wheel)], base, env))
    yield Installed(venv, venv / "bin", python)


@pytest.fixture
def app_dir(tmp_path: Path) -> Path:
    """The application's working directory: its own schemas, processors and projections, and the
    tutorial's ``greet.py``."""
    cwd = tmp_path / "app"
    for name, text in USER_FILES.items():
        (cwd / name).parent.mkdir(parents=True, exist_ok=True)
        (cwd / name).write_text(text)
    [greet] = [b for b in blocks(TUTORIAL) if b.kind == "file" and b.arg == "greet.py"]
    (cwd / "greet.py").write_text(greet.code)
    return cwd


CRASH_IN_MEMORY = """
import runlog, schemas, processors, projections
from pathlib import Path
from greet import app, wf
from runlog.testing import InMemoryWorld

venv = Path(__import__("sys").prefix).resolve()
assert Path(runlog.__file__).resolve().is_relative_to(venv), runlog.__file__  # the wheel's, not the editable
assert (schemas.Greeting.KIND, processors.KIND, projections.KIND) == (
    "user-schemas", "user-processors", "user-projections")
result = InMemoryWorld(app).crash_and_resume(wf, {"to": "grace"}, at="before:EFFECT_RESULT")
assert result.crashed_at == "before:EFFECT_RESULT:deliver/send/0", result.crashed_at
assert result.completed and result.executions["send"] == 1, result
assert len(list(Path("outbox").iterdir())) == 1
print("crashed and resumed", runlog.__version__)
"""


def test_the_tutorial_crashes_and_resumes_in_memory_beside_the_users_modules(
        installed: Installed, app_dir: Path) -> None:
    env = _clean_env({"KAFKA_BOOTSTRAP_SERVERS": "127.0.0.1:9", "REDIS_URL": "redis://127.0.0.1:9/0"},
                     bin_dir=installed.bin)
    out = _ok(_run([str(installed.python), "-c", CRASH_IN_MEMORY], app_dir, env))
    assert out.strip() == f"crashed and resumed {version('runlog')}"


def test_the_tutorial_crashes_and_resumes_on_kafka_and_redis_beside_the_users_modules(
        installed: Installed, app_dir: Path, topics: Settings) -> None:
    """The tutorial's own commands, as its reader types them, with the installed ``runlog``."""
    env = _clean_env(topics.to_env(), bin_dir=installed.bin)
    ran = 0
    for block in blocks(TUTORIAL):
        if block.kind == "file" and block.arg is not None:
            (app_dir / block.arg).write_text(block.code)
        elif block.kind == "run":
            ran += 1
            if block.lang == "python":
                (app_dir / f"_step_{ran}.py").write_text(block.code)
                cmd = [str(installed.python), f"_step_{ran}.py"]
            else:
                cmd = ["bash", "-e", "-c", block.code]
            _ok(_run(cmd, app_dir, env))
    assert ran >= 3
    assert len(list((app_dir / "outbox").iterdir())) == 2  # ada's and grace's, each sent once


def test_the_command_line_answers(installed: Installed, app_dir: Path) -> None:
    env = _clean_env(bin_dir=installed.bin)
    runlog = str(installed.bin / "runlog")
    assert "usage: runlog" in _ok(_run([runlog, "--help"], app_dir, env))
    assert _ok(_run([runlog, "--version"], app_dir, env)).strip() == f"runlog {version('runlog')}"
    assert "usage: runlog" in _ok(_run([str(installed.python), "-m", "runlog", "--help"], app_dir, env))


@pytest.mark.parametrize("name", ["schemas", "producers", "processors", "projections"])
def test_no_top_level_module_of_runlogs_folder_names_is_installed(
        installed: Installed, tmp_path: Path, name: str) -> None:
    elsewhere = tmp_path / "elsewhere"  # outside the repository, without the application's files
    elsewhere.mkdir()
    proc = _run([str(installed.python), "-c", f"import {name}"], elsewhere, _clean_env())
    assert proc.returncode == 1
    assert f"ModuleNotFoundError: No module named '{name}'" in proc.stderr
