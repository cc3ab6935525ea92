"""The fold, the run state, the store port and the internal modules of the pure packages load no driver
(checked in a fresh interpreter)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

DRIVERS = ("confluent_kafka", "redis", "fastavro", "faust")


@pytest.mark.parametrize("module", ["runlog", "runlog.projections.fold", "runlog.projections._state",
                                    "runlog.projections.store", "runlog.schemas", "runlog.schemas.internal",
                                    "runlog.projections.internal"])
def test_importing_loads_no_driver(module: str) -> None:
    code = (f"import json, sys, {module}\n"
            f"print(json.dumps([m for m in {DRIVERS!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == [], f"import {module} loaded {out.stdout.strip()}"


def _prints_ok(code: str) -> None:
    """``code`` run in a fresh interpreter ends well and prints ``ok``."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_the_lazy_names_still_resolve() -> None:
    code = ("import runlog.projections as projections, runlog.schemas as schemas\n"
            "from runlog.projections import RedisStore, rebuild, read_run_tail, BatchProjector\n"
            "from runlog.projections.rebuild import run_events\n"
            "import runlog.projections as p\n"
            "assert callable(rebuild) and p.rebuild is rebuild, p.rebuild\n"
            "assert schemas.Codec.__name__ == 'Codec' and RedisStore.__name__ == 'RedisStore'\n"
            "for n in projections.__all__ + schemas.__all__:\n"
            "    assert hasattr(projections, n) or hasattr(schemas, n), n\n"
            "print('ok')")
    _prints_ok(code)


def test_the_internal_modules_give_every_name_they_declare() -> None:
    code = ("import importlib\n"
            "for pkg in ('schemas', 'projections', 'producers'):\n"
            "    name = f'runlog.{pkg}.internal'\n"
            "    module = importlib.import_module(name)\n"
            "    for n in module.__all__:\n"
            "        assert getattr(module, n) is not None, (name, n)\n"
            "print('ok')")
    _prints_ok(code)


def test_building_the_cli_parser_loads_neither_the_console_server_nor_the_chaos_runner() -> None:
    """Every ``runlog`` command built its parser by importing ``runlog.processors.console`` (aiohttp,
    Jinja2) and ``runlog.processors.chaos`` (its runner and services): about half a second of CPU
    before any command ran."""
    heavy = ("aiohttp", "jinja2", "runlog.processors.console._app", "runlog.processors.chaos.run")
    code = ("import json, sys\n"
            "from runlog.processors.cli import build_parser\n"
            "build_parser().parse_args(['chaos'])  # parsed, not run\n"
            f"print(json.dumps([m for m in {heavy!r} if m in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert json.loads(out.stdout) == [], f"building the parser loaded {out.stdout.strip()}"
    code = ("from runlog.processors.console import Console, ConsoleOptions, make_app, serve\n"
            "import runlog.processors.chaos as chaos\n"
            "for n in chaos.__all__:\n"
            "    assert getattr(chaos, n) is not None, n\n"
            "assert serve.__module__ == 'runlog.processors.console._app' and Console.__name__ == 'Console'\n"
            "print('ok')")
    _prints_ok(code)
