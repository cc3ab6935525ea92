"""The bench's private topics, its own and its raw baselines', get the configured replication.

On the single test broker the configured replication factor is 1, which is also the broker's default;
so the second test asks for one replica more than there are brokers and checks that the broker refuses
every topic: the factor reaches the broker from the settings, it is not left to the broker's default.
"""

from __future__ import annotations

import pytest
from confluent_kafka.admin import AdminClient

from runlog.processors.admin import inspect_topic
from runlog.processors.bench._env import BenchEnv, kafka_replication, replication_mismatch
from runlog.schemas import Settings, Topics
from runlog.schemas.errors import ConfigError

pytestmark = pytest.mark.integration


def test_bench_topics_have_the_configured_replication(settings: Settings) -> None:
    env = BenchEnv(settings)
    try:
        s = env.settings("rf")
        raw = env.raw_topic(s, "raw.events")
        admin = AdminClient(settings.admin_config())
        t = Topics.of(s)
        names = [t.events, t.checkpoints, t.effects, t.resume, t.dlq, raw]
        for name in names:
            # a topic just created may take a moment to appear in the metadata
            assert BenchEnv.wait_until(lambda n=name: inspect_topic(admin, n).action == "ok", 10), name
            found = inspect_topic(admin, name)
            assert found.replication_factor == settings.replication_factor, name
            assert found.config["min.insync.replicas"] == str(settings.min_insync_replicas), name
            assert found.partitions == settings.partitions, name
    finally:
        env.close()
    assert BenchEnv.wait_until(  # deleted with the env
        lambda: all(inspect_topic(admin, n).action == "missing" for n in names), 10)


def test_the_replication_factor_comes_from_the_settings(settings: Settings) -> None:
    info = kafka_replication(settings)
    assert info["brokers"] >= 1
    assert info["broker_default_replication_factor"] is not None  # the mismatch check has the brokers' view
    assert info["replication_factor"] == settings.replication_factor
    problem = replication_mismatch(info)
    if info["broker_default_replication_factor"] <= settings.replication_factor:
        assert problem is None  # the single test broker
    else:  # a replicated cluster, while the test settings ask for one replica: run_bench refuses that
        assert problem is not None and "RUNLOG_REPLICATION_FACTOR" in problem
    more = info["brokers"] + 1  # one replica more than there are brokers: the broker must refuse it
    env = BenchEnv(settings.with_(replication_factor=more, min_insync_replicas=1))
    try:
        with pytest.raises(ConfigError, match=r"(?i)replication"):
            env.settings("rf")
        with pytest.raises(ConfigError, match=r"(?i)replication"):
            env.raw_topic(env.settings("raw", topics=False), "raw.events")
    finally:
        env.close()

