"""Run idempotency keys: the run id is the key's, claims move pending -> started, old claims read started."""

from __future__ import annotations

import json

import pytest
import redis

from producers._runs import RunKeys, run_id_for_key
from schemas import RunConflict, Settings

pytestmark = pytest.mark.integration


def test_the_run_id_is_a_pure_function_of_the_key() -> None:
    assert run_id_for_key("order-1") == run_id_for_key("order-1")
    assert run_id_for_key("order-1") != run_id_for_key("order-2")
    assert run_id_for_key("a").startswith("run-") and len(run_id_for_key("a")) == 36


def test_a_claim_is_pending_until_marked_started(settings: Settings, redis_client: redis.Redis) -> None:
    keys = RunKeys(redis_client, settings.redis_prefix)
    rid = run_id_for_key("k")
    first = keys.claim("k", rid, "p", "wf@1")
    assert (first.run_id, first.created, first.started) == (rid, True, False)
    again = keys.claim("k", rid, "p", "wf@1")
    assert (again.created, again.started) == (False, False)
    keys.mark_started("k", rid, "p", "wf@1")
    assert keys.claim("k", rid, "p", "wf@1").started
    with pytest.raises(RunConflict):
        keys.claim("k", rid, "other-params", "wf@1")


def test_a_claim_written_before_states_existed_reads_started(
        settings: Settings, redis_client: redis.Redis) -> None:
    keys = RunKeys(redis_client, settings.redis_prefix)
    redis_client.set(keys.key("old"), json.dumps({"run_id": "run-legacy", "params_hash": "p",
                                                  "workflow": "wf@1"}))
    c = keys.claim("old", run_id_for_key("old"), "p", "wf@1")
    assert (c.run_id, c.created, c.started) == ("run-legacy", False, True)
