"""Misconfigurations a new user meets, each one line naming the cause and a non-zero exit, never a
traceback (issue 38): ``runlog project`` before ``runlog init``, Redis over TLS without the CA. The
Redis Cluster node behind a ``redis://`` URL is in ``tests/integration/cluster/test_cluster_url.py``;
the Kafka user without the group ACL and the wrong password in ``test_acl_and_runs.py``."""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from runlog.processors.cli.codes import EXIT_UNAVAILABLE, EXIT_USAGE
from runlog.schemas import Settings
from tests.integration.processors.harness import ROOT, env_of
from tests.integration.schemas.test_settings_production import pki, tls_redis  # noqa: F401 -- fixtures

pytestmark = pytest.mark.integration


def runlog(settings: Settings, *argv: str, cwd: Path, timeout: float = 120,
           **env: str) -> tuple[int, list[str], str]:
    """Run ``runlog ARGV``; it must end by itself well within ``timeout``. The bound is loose: on a
    loaded CI host (load average 8 on two cores) a three-second command took 35 s."""
    t0 = time.monotonic()
    out = subprocess.run([sys.executable, "-m", "runlog", *argv], cwd=cwd, capture_output=True, text=True,
                         env={**env_of(settings, **env), "PYTHONPATH": str(ROOT)}, timeout=timeout,
                         check=False)
    took = time.monotonic() - t0
    said = out.stdout + out.stderr
    assert "Traceback" not in said, said
    assert took < timeout / 2, f"runlog {' '.join(argv)} took {took:.1f}s: {said}"
    return out.returncode, [ln for ln in out.stderr.splitlines() if ln.strip()], said


@pytest.fixture
def fresh(settings: Settings) -> Iterator[Settings]:
    """Settings on a topic prefix no topic has: nobody ran ``runlog init`` for it."""
    yield settings.with_(topic_prefix=f"noinit{uuid.uuid4().hex[:8]}.")


def test_project_before_init_is_one_line_and_exit_2(fresh: Settings, tmp_path: Path) -> None:
    """Before: a crash every 10 s (``LogUnavailable ... no partitions in metadata yet``), and on SIGTERM
    ``AttributeError: 'NoneType' object has no attribute 'wakeup'`` after 27 s."""
    rc, lines, said = runlog(fresh, "project", cwd=tmp_path)
    assert rc == EXIT_USAGE, said
    assert len(lines) == 1, said
    assert lines[0].startswith("runlog: configuration error: the projector's topics "), said
    assert f"{fresh.topic_prefix}runlog.events" in lines[0] and "runlog init" in lines[0], said


@pytest.mark.parametrize("command", [["project"], ["demo"], ["runs"]])
def test_redis_over_tls_without_the_ca_is_one_line(tls_redis: str, settings: Settings, tmp_path: Path,  # noqa: F811
                                                   command: list[str]) -> None:
    """``demo`` printed a 32-line worker traceback (``LeaseLost ... CERTIFICATE_VERIFY_FAILED``)."""
    s = settings.with_(redis_url=tls_redis)  # no RUNLOG_REDIS_SSL_CA_*: the server's CA is not trusted
    rc, lines, said = runlog(s, *command, cwd=tmp_path)
    assert rc == EXIT_UNAVAILABLE, said
    assert len(lines) == 1 and lines[0].startswith("runlog: "), said
    assert "CERTIFICATE_VERIFY_FAILED" in lines[0], said
    assert "its TLS certificate is not trusted (set RUNLOG_REDIS_SSL_CA_CERTS or " in lines[0], said
    assert not (tmp_path / ".runlog" / "demo").exists()  # the demo stopped before making its worlds
    print(lines[0])

