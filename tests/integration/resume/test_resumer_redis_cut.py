"""A resumer member whose Redis goes away just as a resume ends keeps serving (found by an hour of
``runlog chaos``: the member exited with "Redis cannot be reached" after a completed resume, when
removing the run from the writers' active set failed). A run left listed there is requested by a
sweep once its lease is gone, and that resume finds it ended and removes it."""

from __future__ import annotations

import logging
import time

import pytest
import redis

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.resume import ResumeOutcome, ResumerService, request_resume
from runlog.schemas import Settings
from tests.integration.resume._toy import crash, toy

pytestmark = pytest.mark.integration


def test_redis_refusing_the_active_set_after_a_resume_leaves_the_member_serving(
        topics: Settings, caplog: pytest.LogCaptureFixture) -> None:
    s = topics.with_(sweep_interval_ms=0)
    t = toy("cut")
    run_id = crash(s, t)
    t.crashing = False
    wait_lease_gone(s, run_id, 10)
    done: list[ResumeOutcome] = []
    caplog.set_level(logging.WARNING, logger="runlog.resumer")
    with ResumerService(s, t.app(), on_outcome=done.append) as service:
        real_remove = service.active.remove
        refused: list[str] = []

        def cut(run: str) -> None:
            refused.append(run)
            raise redis.ConnectionError("Error 111 connecting to 127.0.0.1:6379. Connection refused.")

        service.active.remove = cut  # type: ignore[method-assign]
        request_resume(s, run_id, "lease expired", requested_by="sweeper")
        deadline = time.monotonic() + 60
        while not done:
            assert time.monotonic() < deadline, "no outcome"
            service.poll_once(0.5)  # raised redis.ConnectionError out of the member before the fix
        assert [o.result for o in done] == ["completed"] and refused == [run_id]
        assert any("not removed from the active runs" in r.getMessage() for r in caplog.records)
        service.active.remove = real_remove  # type: ignore[method-assign]
        t.crashing = True
        second = crash(s, t, q="y")  # the member goes on: it resumes the next run too
        t.crashing = False
        wait_lease_gone(s, second, 10)
        request_resume(s, second, "lease expired", requested_by="sweeper")
        deadline = time.monotonic() + 60
        while len(done) < 2:
            assert time.monotonic() < deadline, "no second outcome"
            service.poll_once(0.5)
        assert (done[1].run_id, done[1].result) == (second, "completed"), done[1]
