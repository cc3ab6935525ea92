"""The SDK's durable claims wait for a replica on the cluster (issue 24, item 4): the effects ledger's
claim before an effect, the lease epoch and the run-key claim are answered only once a replica of
their primary holds them, so a failover cannot take back a claim an effect was executed under. A
replica that does not acknowledge (its process stopped) fails the claim, and the effect is not run."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import redis

from runlog.producers.base._redis_io import replica_waits
from runlog.producers.calls._ledger import LedgerEntry, RedisEffectLedger
from runlog.producers.log._lease import RedisLeaseManager
from runlog.producers.run._runs import RunKeys, run_id_for_key
from runlog.schemas import EffectStatus, Settings
from tests.integration.processors.harness import wait_until

from .test_replica_waits import _node, _replica_linked, _waits

pytestmark = pytest.mark.integration


def _primary(client: Any, key: str) -> Any:
    node = client.get_node_from_key(key)
    assert wait_until(lambda: _replica_linked(node), 60, every=0.5), f"{node.name} has no online replica"
    return node


def test_the_ledger_claim_the_lease_and_the_run_key_wait_for_a_replica(
        settings: Settings, redis_client_: Any) -> None:
    waits = replica_waits(redis_client_, settings)
    assert waits.enabled  # RUNLOG_REDIS_WAIT_REPLICAS=auto on a cluster
    ledger = RedisEffectLedger(redis_client_, settings.redis_prefix, waits=waits)
    dk = "d" * 64
    node = _primary(redis_client_, ledger.claim_key(dk))
    before = _waits(node)
    assert ledger.open(LedgerEntry(dk, "run-a", "c1", EffectStatus.INTENT, None)) is None
    assert _waits(node) == before + 1

    leases = RedisLeaseManager(redis_client_, settings, waits=waits)
    try:
        node = _primary(redis_client_, leases.epoch_key("run-w"))
        before = _waits(node)
        lease = leases.acquire("run-w")
        assert lease.epoch == 1 and _waits(node) == before + 1
        lease.release()
    finally:
        leases.close()

    keys = RunKeys(redis_client_, settings.redis_prefix, waits=waits)
    node = _primary(redis_client_, keys.key("order-1"))
    before = _waits(node)
    assert keys.claim("order-1", "run-k", "p" * 64, "wf").created
    assert _waits(node) == before + 1


@contextmanager
def _replica_stopped(client: Any, node: Any) -> Iterator[None]:
    c = _node(node)
    try:
        replica = c.info("replication")["slave0"]
    finally:
        c.close()
    if replica["ip"] not in ("127.0.0.1", "::1", "localhost"):
        pytest.skip(f"the replica {replica['ip']} is not a process of this machine")
    rc = redis.Redis(host=replica["ip"], port=int(replica["port"]))
    try:
        pid = int(rc.info("server")["process_id"])
    finally:
        rc.close()
    os.kill(pid, signal.SIGSTOP)  # alive for its master, acknowledging nothing
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


def test_a_claim_no_replica_acknowledges_fails_and_the_effect_is_not_run(
        topics: Settings, cluster_url: str) -> None:
    if os.environ.get("RUNLOG_TEST_REDIS_CLUSTER_URL"):
        pytest.skip("a cluster from RUNLOG_TEST_REDIS_CLUSTER_URL is not ours to stop nodes of")
    from runlog.producers import CallInfo, Runner, StageContext, Workflow, tool
    from runlog.producers.calls._keys import delivery_key
    from runlog.schemas import ReplayPolicy
    from runlog.schemas._redis import redis_client
    from runlog.schemas.errors import RunlogError
    from tests.integration.producers.conftest import SOURCE

    settings = topics.with_(redis_url=cluster_url, redis_wait_ms=300)
    charged: list[str] = []

    @tool("charge", policy=ReplayPolicy.NEVER, target="cards:charges",
          delivery=lambda args, call: ("acct", "cards", str(args["order"]), "1"))
    def charge(call: CallInfo, order: str) -> Any:
        charged.append(order)
        return {"external_id": f"ch-{order}"}

    wf = Workflow("pay", version="1")

    @wf.stage("pay")
    def pay(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"charge": ctx.call(charge, order="o-1")}

    client = redis_client(settings)
    try:
        ledger = RedisEffectLedger(client, settings.redis_prefix)
        node = _primary(client, ledger.claim_key(delivery_key("acct", "cards", "o-1", "1")))
        # runs whose own claims (run key, lease epoch) live on other primaries: only the effect's
        # claim meets the stopped replica
        keys = RunKeys(client, settings.redis_prefix)
        leases = RedisLeaseManager(client, settings)
        elsewhere = [k for k in (f"order-{i}" for i in range(200))
                     if node.name not in (client.get_node_from_key(keys.key(k)).name,
                                          client.get_node_from_key(leases.epoch_key(run_id_for_key(k))).name)]
        leases.close()
        with Runner.from_settings(settings, source=SOURCE) as runner, _replica_stopped(client, node), \
                pytest.raises(RunlogError, match="replicas") as raised:
            runner.run(wf, {}, {}, idempotency_key=elsewhere[0])
        assert "replicas" in str(raised.value)
        assert charged == []  # the claim was not known to be on a replica: nothing executed
        # the claim nothing acted on was released: another run takes the key and charges once
        assert ledger.lookup(delivery_key("acct", "cards", "o-1", "1")).status is EffectStatus.FAILED
        with Runner.from_settings(settings, source=SOURCE) as runner:
            assert runner.run(wf, {}, {}, idempotency_key=elsewhere[1]).completed
        assert charged == ["o-1"]
    finally:
        for k in list(client.scan_iter(match=f"{settings.redis_prefix}:*", count=1000)):
            client.delete(k)
        client.close()


@pytest.mark.slow
def test_the_master_holding_a_never_effects_claim_killed_before_the_call_one_execution(
        topics: Settings, cluster_url: str) -> None:
    """Issue 24, item 4's acceptance: the master holding a NEVER effect's ledger claim is SIGKILLed
    between the claim and the call; a replica is promoted; a second run asking for the same delivery
    key meanwhile finds the claim (it was on the replica before the claim answered) and is in doubt:
    the charge is executed once, by the run that claimed it."""
    if os.environ.get("RUNLOG_TEST_REDIS_CLUSTER_URL"):
        pytest.skip("a cluster from RUNLOG_TEST_REDIS_CLUSTER_URL is not ours to kill nodes of")
    import threading

    from runlog.producers import CallInfo, Runner, StageContext, Workflow, tool
    from runlog.producers.calls._keys import delivery_key
    from runlog.schemas import ReplayPolicy
    from runlog.schemas._redis import redis_client
    from runlog.schemas.errors import EffectInDoubt
    from tests.integration.producers.conftest import SOURCE

    from .test_failover_stream import _cluster_script, _node_number, _replicas_linked, _restart

    settings = topics.with_(redis_url=cluster_url)
    client = redis_client(settings)
    ledger = RedisEffectLedger(client, settings.redis_prefix)
    dk = delivery_key("acct", "cards", "o-kill", "1")
    claim = ledger.claim_key(dk)
    node = client.get_node_from_key(claim)
    assert wait_until(lambda: _replicas_linked(client), 60, every=0.5), "replicas not linked"
    keys = RunKeys(client, settings.redis_prefix)
    leases = RedisLeaseManager(client, settings)
    # runs whose own keys live on other primaries: the kill takes only the effect's claim's master
    elsewhere = [k for k in (f"pay-{i}" for i in range(300))
                 if node.name not in (client.get_node_from_key(keys.key(k)).name,
                                      client.get_node_from_key(leases.epoch_key(run_id_for_key(k))).name)]
    leases.close()
    charged: list[str] = []
    second: list[BaseException | object] = []
    killed = _node_number(int(node.port))

    wf = Workflow("pay-kill", version="1")

    @tool("charge", policy=ReplayPolicy.NEVER, target="cards:charges",
          delivery=lambda args, call: ("acct", "cards", str(args["order"]), "1"))
    def charge(call: CallInfo, order: str) -> Any:
        if call.run_id == run_id_for_key(elsewhere[0]):
            # between the claim and the call: the claim's master dies, a replica takes over
            assert _cluster_script("kill", str(killed)).returncode == 0

            def promoted() -> bool:
                try:
                    client.nodes_manager.initialize()
                    return client.get_node_from_key(claim).port != node.port
                except Exception:  # noqa: BLE001 - the cluster is between states
                    return False

            assert wait_until(promoted, 60, every=0.5), "no replica was promoted"
            # a second run asks for the same delivery key now, on the promoted replica
            t = threading.Thread(target=lambda: second.append(_second_run()))
            t.start()
            t.join(60)
        charged.append(call.run_id)
        return {"external_id": f"ch-{order}"}

    @wf.stage("pay")
    def pay(ctx: StageContext, inputs: dict[str, Any]) -> dict[str, Any]:
        return {"charge": ctx.call(charge, order="o-kill")}

    def _second_run() -> object:
        try:
            with Runner.from_settings(settings, source=SOURCE) as r:
                return r.run(wf, {}, {}, idempotency_key=elsewhere[1])
        except BaseException as err:  # noqa: BLE001 - the test looks at it
            return err

    try:
        with Runner.from_settings(settings, source=SOURCE) as runner:
            first = runner.run(wf, {}, {}, idempotency_key=elsewhere[0])
        assert first.completed
        assert len(second) == 1 and isinstance(second[0], EffectInDoubt), second
        assert charged == [run_id_for_key(elsewhere[0])]  # one execution
    finally:
        _restart(killed)
        for k in list(client.scan_iter(match=f"{settings.redis_prefix}:*", count=1000)):
            client.delete(k)
        client.close()
