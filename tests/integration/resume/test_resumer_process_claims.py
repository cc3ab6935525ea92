"""What the scale-out page says of a ``runlog resumer`` process, tested as processes on the real
broker and Redis: a second SIGTERM abandons the work in hand and exits 130; a static member
(``RUNLOG_GROUP_INSTANCE_ID``) restarted within the session timeout gets its partitions back
without the group rebalancing; two processes with one id fence each other (the older stops with a
fatal error)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
import uuid

import pytest
from confluent_kafka.admin import AdminClient

from runlog.processors.demo.run import worker_env
from runlog.schemas import Settings

pytestmark = pytest.mark.integration

APP = "runlog.processors.demo.pipeline:app"


class Resumer:
    """A ``runlog resumer`` process whose stderr is read as it comes."""

    def __init__(self, settings: Settings, group: str, instance: str | None = None) -> None:
        env = {**worker_env(settings, "http://127.0.0.1:9"), "RUNLOG_RESUMER_GROUP": group}
        if instance is not None:
            env["RUNLOG_GROUP_INSTANCE_ID"] = instance
        self.proc = subprocess.Popen([sys.executable, "-m", "runlog", "resumer", "--app", APP], env=env,
                                     cwd=os.getcwd(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line)

    def wait_for(self, text: str, timeout: float = 60) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(text in line for line in self.lines):
                return True
            if self.proc.poll() is not None:
                time.sleep(0.2)  # the last lines
                return any(text in line for line in self.lines)
            time.sleep(0.05)
        return False

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        rc = self.proc.wait(30)
        self._reader.join(10)
        if self.proc.stderr is not None:
            self.proc.stderr.close()
        return rc

    @property
    def err(self) -> str:
        return "".join(self.lines)


def _group_state(settings: Settings, prefix: str) -> tuple[str, int]:
    admin = AdminClient(settings.admin_config())
    names = [g.group_id for g in admin.list_consumer_groups().result().valid if g.group_id.startswith(prefix)]
    assert len(names) == 1, names
    described = admin.describe_consumer_groups(names)[names[0]].result()
    return str(described.state), len(described.members)


def test_a_second_sigterm_abandons_the_work_in_hand_and_exits_130(topics: Settings) -> None:
    member = Resumer(topics, f"t-twice-{uuid.uuid4().hex[:8]}")
    try:
        assert member.wait_for("assigned partitions"), member.err
        member.proc.send_signal(signal.SIGTERM)
        assert member.wait_for("SIGTERM, stopping after the request in hand", 10), member.err
        member.proc.send_signal(signal.SIGTERM)
        rc = member.proc.wait(30)
    finally:
        member.stop()
    assert rc == 130, member.err
    assert "runlog: interrupted" in member.err and "Traceback" not in member.err, member.err


def test_static_members_come_back_without_a_rebalance_and_one_id_fences_the_older(topics: Settings) -> None:
    group = f"t-static-{uuid.uuid4().hex[:8]}"
    full = topics.group_id(f"{group}.wf-")
    first = Resumer(topics, group, instance="pod-0")
    try:
        assert first.wait_for("assigned partitions"), first.err
        first.proc.send_signal(signal.SIGTERM)
        assert first.proc.wait(30) == 0, first.err
    finally:
        first.stop()
    # a static member does not leave on stop: it stays in the group, which does not rebalance
    state, members = _group_state(topics, full)
    assert members == 1, (state, members)
    again = Resumer(topics, group, instance="pod-0")  # within the session timeout
    try:
        assert again.wait_for("assigned partitions"), again.err
        state, members = _group_state(topics, full)
        assert members == 1 and "STABLE" in state.upper(), (state, members)
        twin = Resumer(topics, group, instance="pod-0")  # a second process with the same id
        try:
            assert twin.wait_for("assigned partitions"), twin.err
            assert again.proc.wait(60) == 1, again.err  # the older one is fenced: a fatal error
            last = again.err.strip().splitlines()[-1]
            assert last.startswith("runlog: RunlogError: the resume topic's consumer stopped for good")
            assert "fenced" in last and "Traceback" not in again.err, again.err
            assert twin.proc.poll() is None  # the newer one goes on
        finally:
            twin.proc.send_signal(signal.SIGTERM)
            twin.proc.wait(30)
            twin.stop()
    finally:
        again.stop()
