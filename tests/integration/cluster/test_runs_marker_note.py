"""``runlog runs`` on a cluster namespace a swap is moving: while the marker is not ``ready`` the index
shards may list a run under an old status, so the listing comes from the events topic instead, with a
note on stderr (``docs/how-to/scale-out.md``, Redis Cluster); a READY namespace is listed from its indexes."""

from __future__ import annotations

import json
from typing import Any

import pytest

from runlog.processors.cli import main
from runlog.projections import RedisStore
from runlog.projections._marker import REBUILDING, marker_key
from runlog.schemas import Settings
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def _runs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["runs", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_runs_lists_from_the_log_while_the_namespace_is_marked_rebuilding(
        topics: Settings, redis_client_: Any, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    from tests.integration.processors.harness import produce

    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    events = full_run("run-swapped", stages=2)
    produce(topics, events)
    store = RedisStore(redis_client_, topics.redis_prefix)
    store.apply(fold_updates(events[:3]))  # the index holds an older state than the log
    marker = store.marker()
    assert marker is not None and marker.state != REBUILDING

    rc, out, err = _runs(capsys, "--json")
    assert rc == 0 and [(d["run_id"], d["last_seq"]) for d in json.loads(out)] == [("run-swapped", 3)]
    assert err == ""  # ready: from the indexes

    redis_client_.hset(marker_key(topics.redis_prefix), "state", REBUILDING)  # a swap midway
    rc, out, err = _runs(capsys, "--json")
    assert rc == 0 and [(d["run_id"], d["last_seq"]) for d in json.loads(out)] == \
        [("run-swapped", len(events))]  # from the log: the truth
    (note,) = err.splitlines()
    assert note.startswith("runlog runs: listed from the events topic: the projection")
    assert "marked 'rebuilding'" in note and topics.redis_prefix in note

    rc, out, err = _runs(capsys)  # the table too
    assert rc == 0 and "run-swapped" in out and "marked 'rebuilding'" in err
