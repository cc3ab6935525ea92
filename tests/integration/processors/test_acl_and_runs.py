"""Against the session's SASL_SSL broker (:mod:`tests.integration._secure_broker`, with an authorizer):
a least-privilege user without the consumer group's ACL, and ``runlog runs`` with a wrong password
(issue 38). Each is one line and exit 4."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
)

from runlog.processors.admin import ensure_topics
from runlog.processors.cli.codes import EXIT_AUTH
from runlog.projections import RedisStore, RunStatus
from runlog.schemas import Settings
from tests.integration._secure_broker import LEAST, SecureBroker
from tests.integration.processors.harness import ROOT

pytestmark = pytest.mark.integration


def _runlog(s: Settings, cwd: Path, *argv: str) -> tuple[int, list[str], str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RUNLOG_", "KAFKA_", "REDIS_"))}
    env.update(s.to_env())
    out = subprocess.run([sys.executable, "-m", "runlog", *argv], cwd=cwd, capture_output=True, text=True,
                         env={**env, "PYTHONPATH": str(ROOT)}, timeout=60, check=False)
    said = out.stdout + out.stderr
    assert "Traceback" not in said, said
    return out.returncode, [ln for ln in out.stderr.splitlines() if ln.strip()], said


@pytest.fixture
def secured(secure_broker: SecureBroker, settings: Settings) -> Iterator[Settings]:
    """The test's settings as the broker's super user, with Runlog's topics created."""
    s = settings.with_(kafka_bootstrap_servers=secure_broker.sasl_bootstrap, kafka_extra=secure_broker.sasl())
    ensure_topics(s)
    yield s


def test_a_user_without_the_group_acl_hears_authorization_and_the_real_group(
        secure_broker: SecureBroker, secured: Settings, tmp_path: Path) -> None:
    """Before: 11 Faust tracebacks naming the unprefixed group ``runlog-projector``, never "authorization"."""
    deny = AclBinding(ResourceType.GROUP, secured.topic_prefix, ResourcePatternType.PREFIXED, f"User:{LEAST}",
                      "*", AclOperation.ALL, AclPermissionType.DENY)
    admin = AdminClient(secured.admin_config())
    for f in admin.create_acls([deny]).values():
        f.result(30)
    try:
        least = secured.with_(kafka_extra=secure_broker.least())
        rc, lines, said = _runlog(least, tmp_path, "project")
    finally:
        gone = AclBindingFilter(ResourceType.GROUP, secured.topic_prefix, ResourcePatternType.PREFIXED,
                                f"User:{LEAST}", "*", AclOperation.ANY, AclPermissionType.ANY)
        for f in admin.delete_acls([gone]).values():
            f.result(30)
    group = secured.group_id("runlog-projector")
    assert group.startswith(secured.topic_prefix) and group != "runlog-projector"
    assert rc == EXIT_AUTH, said
    failed = [ln for ln in lines if "failed" in ln]
    assert len(failed) == 1 and failed[0].startswith("runlog: authorization failed: "), said
    assert f"consumer group {group!r}" in failed[0] and f"user '{LEAST}'" in failed[0], said


def test_runs_with_a_wrong_password_exits_4_though_redis_answers(
        secure_broker: SecureBroker, secured: Settings, tmp_path: Path) -> None:
    """``runlog runs`` reads the projection in Redis; with a wrong Kafka password it listed the runs and
    exited 0 while every other command exited 4."""
    from tests.unit.projections.runlogs import WORKFLOW, RunBuilder
    from tests.unit.projections.store_contract import fold_updates

    store = RedisStore.from_settings(secured)
    try:
        b = RunBuilder("run-listed").start(dataclasses.replace(WORKFLOW, name="listed"))
        store.apply(fold_updates(b.events))
        assert store.runs(RunStatus.RUNNING) == ["run-listed"]
    finally:
        store.client.close()
    rc, _, said = _runlog(secured, tmp_path, "runs")
    assert rc == 0 and "run-listed" in said, said  # the right password lists it
    wrong_password = "wrong-" + os.urandom(4).hex()
    wrong = secured.with_(kafka_extra={**secured.kafka_extra, "sasl.password": wrong_password})
    rc, lines, said = _runlog(wrong, tmp_path, "runs")
    assert rc == EXIT_AUTH, said
    assert len(lines) == 1 and lines[0].startswith("runlog: authentication failed: "), said
    assert "run-listed" not in said
