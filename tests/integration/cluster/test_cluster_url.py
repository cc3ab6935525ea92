"""A plain ``redis://`` URL naming a Redis Cluster node (issue 38): ``runlog doctor`` named the problem,
``runlog project`` crashed with six tracebacks (``ProjectionStoreError: reading the namespace marker
failed: 15798 127.0.0.1:...``, a MOVED reply) and ``runlog demo`` printed a 33-line worker traceback.
Every command now says it in one line and exits 2 (a configuration error)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from runlog.processors.cli.codes import EXIT_USAGE
from runlog.projections.internal import marker_key
from runlog.schemas import Settings
from tests.integration.processors.harness import ROOT, env_of

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("command", [["project"], ["demo"], ["runs"], ["projections", "rebuild"]])
def test_a_redis_url_naming_a_cluster_node_is_one_line_from_every_command(
        topics: Settings, tmp_path: Path, command: list[str]) -> None:
    first = urlsplit(topics.redis_url).netloc.split(",")[0]  # one node of the session's cluster
    s = topics.with_(redis_url=f"redis://{first}/0")  # the topics exist: Redis is what is wrong
    out = subprocess.run([sys.executable, "-m", "runlog", *command], cwd=tmp_path, capture_output=True,
                         text=True, env={**env_of(s), "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    said = out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == EXIT_USAGE, said
    assert "Traceback" not in said, said
    assert len(lines) == 1 and lines[0].startswith("runlog: configuration error: "), said
    assert f"redis://{first}/0" in lines[0] and "Redis Cluster node" in lines[0], said
    assert "redis+cluster://" in lines[0], said


def test_a_cluster_node_owning_the_namespace_marker_is_not_taken_for_a_new_namespace(
        topics: Settings, tmp_path: Path) -> None:
    """The node answers the marker's key itself when its slot is the node's (no MOVED): ``runlog runs``
    found no marker and listed from the log with exit 0, whichever prefix the session drew. The store
    asks the server whether it is a cluster node when the marker is missing."""
    def owned(node: str, prefix: str) -> bool:
        host, port = node.rsplit(":", 1)
        client = redis.Redis(host=host, port=int(port))
        try:
            client.exists(marker_key(prefix))
        except redis.exceptions.MovedError:  # another node's slot (or this node is a replica now)
            return False
        finally:
            client.close()
        return True

    nodes = urlsplit(topics.redis_url).netloc.split(",")
    first, prefix = next((n, p) for p in (f"{topics.redis_prefix}-{i}" for i in range(200)) for n in nodes
                         if owned(n, p))
    s = topics.with_(redis_url=f"redis://{first}/0", redis_prefix=prefix)
    out = subprocess.run([sys.executable, "-m", "runlog", "runs"], cwd=tmp_path, capture_output=True,
                         text=True, env={**env_of(s), "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    said = out.stdout + out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert out.returncode == EXIT_USAGE, said
    assert len(lines) == 1 and "Redis Cluster node" in lines[0] and "redis+cluster://" in lines[0], said
