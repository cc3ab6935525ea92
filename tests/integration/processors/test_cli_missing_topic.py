"""``runlog show`` / ``runlog resume`` on a prefix with no events topic: one line, exit 2, no traceback."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

import pytest

from runlog.schemas import Settings

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", [["show", "run-x"], ["resume", "run-x"]])
def test_a_missing_events_topic_is_a_configuration_error(settings: Settings, command: list[str]) -> None:
    prefix = f"missing{uuid.uuid4().hex[:8]}."
    env = {**os.environ, **settings.with_(topic_prefix=prefix).to_env()}
    proc = subprocess.run([sys.executable, "-m", "runlog", *command], env=env, capture_output=True,
                          text=True, timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and f"the events topic {prefix}runlog.events does not exist" in lines[0]
    assert "Traceback" not in proc.stderr
