"""``runlog runs`` on a cluster namespace a swap is moving: the listing fans out over the index shards
without the marker's say, so while the marker is ``rebuilding`` it notes on stderr that a run may be
listed under an old status (``README.md``, Redis Cluster); a READY namespace is listed without it."""

from __future__ import annotations

import json
from typing import Any

import pytest

from processors.cli import main
from projections import RedisStore
from projections._marker import REBUILDING, marker_key
from schemas import Settings
from tests.unit.projections.runlogs import full_run
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def _runs(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["runs", *args])
    out, err = capsys.readouterr()
    return rc, out, err


def test_runs_notes_a_namespace_marked_rebuilding(settings: Settings, redis_client_: Any,
                                                  monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in settings.to_env().items():
        monkeypatch.setenv(k, v)
    store = RedisStore(redis_client_, settings.redis_prefix)
    store.apply(fold_updates(full_run("run-swapped", stages=2)))
    marker = store.marker()
    assert marker is not None and marker.state != REBUILDING

    rc, out, err = _runs(capsys, "--json")
    assert rc == 0 and [d["run_id"] for d in json.loads(out)] == ["run-swapped"]
    assert err == ""

    redis_client_.hset(marker_key(settings.redis_prefix), "state", REBUILDING)  # a swap midway
    rc, out, err = _runs(capsys, "--json")
    assert rc == 0 and [d["run_id"] for d in json.loads(out)] == ["run-swapped"]  # still listed
    (note,) = err.splitlines()
    assert note.startswith("runlog runs: the projection is marked 'rebuilding'")
    assert "old status" in note and settings.redis_prefix in note

    rc, out, err = _runs(capsys)  # the table too
    assert rc == 0 and "run-swapped" in out and "marked 'rebuilding'" in err
