"""``runlog runs`` as a table: every column as wide as its widest cell, so long workflow or stage names
do not shift the columns after them (issue 29)."""

from __future__ import annotations

import dataclasses

import pytest
import redis

from runlog.processors.cli import main
from runlog.projections import RedisStore
from runlog.schemas import Settings
from tests.unit.projections.runlogs import WORKFLOW, RunBuilder
from tests.unit.projections.store_contract import fold_updates

pytestmark = pytest.mark.integration


def test_runs_columns_line_up_for_long_workflow_names(topics: Settings, redis_client: redis.Redis,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    for k, v in topics.to_env().items():
        monkeypatch.setenv(k, v)
    store = RedisStore(redis_client, topics.redis_prefix)
    for run_id, name in (("run-short", "wf"), ("run-long", "a-workflow-with-a-rather-long-name-indeed")):
        b = RunBuilder(run_id).start(dataclasses.replace(WORKFLOW, name=name))
        store.apply(fold_updates(b.events))
    capsys.readouterr()
    assert main(["runs"]) == 0
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith(("run", "run-"))]
    head, *rows = lines
    assert len(rows) == 2
    status_at = head.index("status")
    assert all(row[status_at:].startswith("RUNNING") for row in rows), lines
    seq_end = head.index("seq") + len("seq")
    assert all(row[:seq_end].rstrip().endswith("1") for row in rows), lines
