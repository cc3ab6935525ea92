"""Node tools other services read the contract with (``@asyncapi/parser``, ``avsc``), installed once.

The versions are pinned by ``node/package-lock.json``; ``npm ci`` installs them into
``.runlog/node/<hash of the lock file>`` the first time a test asks (under a file lock, so
parallel sessions install once), and the scripts in ``node/`` run with that ``NODE_PATH``.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

__all__ = ["NodeTools"]

HERE = Path(__file__).resolve().parent / "node"
ROOT = Path(__file__).resolve().parents[3]


class NodeTools:
    """``node`` with the pinned packages on its module path."""

    def __init__(self, modules: Path) -> None:
        self.modules = modules

    @classmethod
    def install(cls) -> NodeTools:
        node, npm = shutil.which("node"), shutil.which("npm")
        if node is None or npm is None:
            pytest.fail("the contract checks run node and npm (apt-get install nodejs npm)")
        lock = (HERE / "package-lock.json").read_bytes()
        target = ROOT / ".runlog" / "node" / hashlib.sha256(lock).hexdigest()[:12]
        done = target / "node_modules" / ".runlog-installed"
        target.mkdir(parents=True, exist_ok=True)
        with open(target / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            if not done.exists():
                for f in ("package.json", "package-lock.json"):
                    shutil.copyfile(HERE / f, target / f)
                res = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--ignore-scripts"], cwd=target,
                                     capture_output=True, text=True, timeout=900, check=False)
                if res.returncode != 0:
                    pytest.fail(f"npm ci of the contract tools failed:\n{res.stderr[-3000:]}")
                done.touch()
        return cls(target / "node_modules")

    def run(self, script: str, *args: str) -> Any:
        """Run ``node/<script>`` with ``args``; its standard output as JSON."""
        res = subprocess.run(["node", str(HERE / script), *args], capture_output=True, text=True, timeout=300,
                             check=False, env={**os.environ, "NODE_PATH": str(self.modules)})
        assert res.returncode == 0, res.stderr[-3000:]
        return json.loads(res.stdout)
