"""``deploy/env.sh`` points the processes of ``deploy/test`` and ``deploy/demo`` at one cache of compiled
modules (docs/testing.md, "Compiled modules in one cache"): a process started by a test writes what it
compiles there, and the next one reads it instead of compiling again."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from tests.conftest import require


def test_processes_started_by_the_suite_share_one_cache_of_compiled_modules(tmp_path: Path) -> None:
    prefix = os.environ.get("PYTHONPYCACHEPREFIX")
    require(prefix and not os.environ.get("PYTHONDONTWRITEBYTECODE"),
            "not run through deploy/test: deploy/env.sh sets PYTHONPYCACHEPREFIX and unsets "
            "PYTHONDONTWRITEBYTECODE")
    assert prefix is not None
    assert sys.pycache_prefix == prefix and not sys.dont_write_bytecode
    source = tmp_path / "cached_here.py"  # a module of this test's own: no other test compiles it
    source.write_text("VALUE = 42\n")
    cached = Path(importlib.util.cache_from_source(str(source)))
    assert cached.is_relative_to(prefix)
    imports = [sys.executable, "-c", "import cached_here; assert cached_here.VALUE == 42"]
    try:
        # a new interpreter, as the tests start them: it compiles the module into the cache ...
        subprocess.run(imports, check=True, cwd=tmp_path)
        assert cached.is_file()
        written = cached.stat().st_mtime_ns
        # ... and the next one reads it (not written again); nothing is written beside the source
        subprocess.run(imports, check=True, cwd=tmp_path)
        assert cached.stat().st_mtime_ns == written
        assert not (tmp_path / "__pycache__").exists()
    finally:
        cached.unlink(missing_ok=True)
