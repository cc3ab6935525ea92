"""Resumer group membership (issue #24, item 1): members come and go under a stream of requests.

Two ``ResumerService`` members (threads, each with its own consumer) handle resume requests for a
stream of crashed runs while a third member joins and leaves (closes) three times. Every join and
leave rebalances the group; a member whose commit lands in a rebalance gets it refused
(``ILLEGAL_GENERATION``, ``REBALANCE_IN_PROGRESS``, ...). Before the fix the commit raised and the
member died; now it logs a warning and goes on, and the request's new owner handles it again
(idempotent). Real broker and Redis.
"""

from __future__ import annotations

import logging
import random
import threading
import time
import uuid

import pytest
from confluent_kafka import Producer

from runlog.processors.demo.run import wait_lease_gone
from runlog.processors.resume import ResumeOutcome, Resumer, request_resume
from runlog.projections import RunStatus
from runlog.schemas import Codec, EventType, Settings
from tests.integration.resume._members import Member, until
from tests.integration.resume._toy import crash, toy
from tests.integration.resume.conftest import log_of

pytestmark = pytest.mark.integration

RUNS = 8
CYCLES = 3


def test_members_survive_a_third_joining_and_leaving_and_every_run_completes(
        topics: Settings, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="runlog.resumer")
    s = topics.with_(resumer_group=f"t-members-{uuid.uuid4().hex[:8]}", sweep_interval_ms=0)
    t = toy(f"mem{uuid.uuid4().hex[:6]}")
    runs = [crash(s, t, q=f"q{i}") for i in range(RUNS)]
    for run_id in runs:
        wait_lease_gone(s, run_id, 10)
    done: list[ResumeOutcome] = []
    a = Member(s, t.app(), "a", done)
    b = Member(s, t.app(), "b", done)
    feeding = threading.Event()
    fed = [0]

    def feed() -> None:
        # the runs' requests, then the same requests again and again: every request is committed,
        # so commits keep landing while members join and leave
        p = Producer(s.producer_config())
        codec = Codec.from_settings(s)
        rng = random.Random(7)
        try:
            for run_id in runs:
                request_resume(s, run_id, "crashed", requested_by="t", producer=p, codec=codec)
                fed[0] += 1
            while not feeding.is_set():
                request_resume(s, rng.choice(runs), "again", requested_by="t", producer=p, codec=codec)
                fed[0] += 1
                feeding.wait(0.02)
        finally:
            p.flush(10)

    feeder = threading.Thread(target=feed, name="feeder", daemon=True)
    try:
        until(lambda: a.assigned() > 0 and b.assigned() > 0, "both members' assignments", (a, b))
        feeder.start()
        for cycle in range(CYCLES):
            c = Member(s, t.app(), f"c{cycle}", done)
            try:
                member, seen = c, len(done)
                until(lambda: member.assigned() > 0, f"c{cycle}'s assignment", (a, b, c))  # noqa: B023
                until(lambda: len(done) >= seen + 5, f"requests handled while c{cycle} is a member",  # noqa: B023
                       (a, b, c))
            finally:
                c.leave()
            assert not c.errors, c.errors
            until(lambda: a.assigned() + b.assigned() == s.partitions, "the partitions back with a and b",
                   (a, b))
            assert a.thread.is_alive() and b.thread.is_alive(), (a.errors, b.errors)
        until(lambda: {o.run_id for o in list(done) if o.result in ("completed", "nothing_to_do")}
               >= set(runs), "every run completed", (a, b))
        assert a.thread.is_alive() and b.thread.is_alive(), (a.errors, b.errors)
    finally:
        feeding.set()
        if feeder.is_alive():
            feeder.join(30)
        for m in (a, b):
            m.leave()
    assert not a.errors and not b.errors, (a.errors, b.errors)
    # every run completed once: one RUN_COMPLETED each, no tool ran again
    with Resumer(s, t.app()) as r:
        statuses = {run_id: r.load(run_id)[0].status for run_id in runs}
    assert statuses == dict.fromkeys(runs, RunStatus.COMPLETED)
    for run_id in runs:
        types = [le.event.type for le in log_of(s, run_id) if le.outcome.accepted]
        assert types.count(EventType.RUN_COMPLETED) == 1, (run_id, types)
    assert t.calls == {"lookup": RUNS, "render": RUNS}, t.calls
    refused = [r.getMessage() for r in caplog.records if "the group moved on" in r.getMessage()]
    print(f"{fed[0]} requests, {len(done)} outcomes, {len(refused)} commits refused by a rebalance")


def test_runlog_resumer_stops_on_sigterm_leaving_the_group_and_exits_0(topics: Settings) -> None:
    import os
    import signal
    import subprocess
    import sys

    from confluent_kafka.admin import AdminClient

    from runlog.processors.demo.run import worker_env

    group = f"t-term-{uuid.uuid4().hex[:8]}"
    env = {**worker_env(topics, "http://127.0.0.1:9"), "RUNLOG_RESUMER_GROUP": group}
    proc = subprocess.Popen([sys.executable, "-m", "runlog", "resumer", "--app",
                             "runlog.processors.demo.pipeline:app"], env=env, cwd=os.getcwd(),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stderr is not None
        deadline, lines = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            lines.append(proc.stderr.readline())
            if "assigned partitions" in lines[-1]:
                break
        assert "assigned partitions" in lines[-1], "".join(lines)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err  # it died with 143 before
    assert "stopped by SIGTERM" in err, err
    admin = AdminClient(topics.admin_config())
    full = topics.group_id(f"{group}.wf-")
    names = [g.group_id for g in admin.list_consumer_groups().result().valid if g.group_id.startswith(full)]
    assert len(names) == 1, names
    described = admin.describe_consumer_groups(names)[names[0]].result()
    assert not described.members, described  # it left the group (a dead member would stay until its timeout)
