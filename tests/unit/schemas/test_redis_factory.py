"""REDIS_URL schemes: standalone clients as before, ``redis+cluster://`` parsed and validated, the
index shard function pinned (writers and readers of different versions must agree on it)."""

from __future__ import annotations

import pytest
import redis

from runlog.schemas import Settings
from runlog.schemas._redis import (
    INDEX_SHARDS,
    cluster_nodes,
    index_shard,
    is_cluster,
    is_cluster_url,
    redis_client,
)
from runlog.schemas.errors import ConfigError


def test_a_cluster_url_names_its_nodes_credentials_and_tls() -> None:
    assert cluster_nodes("redis+cluster://127.0.0.1:17001,127.0.0.1:17002") == (
        [("127.0.0.1", 17001), ("127.0.0.1", 17002)], None, None, False)
    tls = cluster_nodes("rediss+cluster://u:p%40ss@h1:7000,h2/0")
    assert tls == ([("h1", 7000), ("h2", 6379)], "u", "p@ss", True)
    assert is_cluster_url("redis+cluster://h:1") and not is_cluster_url("redis://h:1/0")


@pytest.mark.parametrize("url", ["redis+cluster://", "redis+cluster://h:1/3", "redis+cluster://h:x",
                                 "redis+cluster://:7000"])
def test_bad_cluster_urls_are_config_errors(url: str) -> None:
    with pytest.raises(ConfigError):
        Settings.from_env({"REDIS_URL": url})


def test_cluster_urls_are_valid_settings_and_their_password_is_masked() -> None:
    s = Settings.from_env({"REDIS_URL": "redis+cluster://user:secret@h1:7000,h2:7001"})
    assert s.redacted()["redis_url"] == "redis+cluster://user:***@h1:7000,h2:7001"
    assert "secret" not in repr(s)
    with pytest.raises(ConfigError, match="rediss://"):  # TLS settings need a TLS URL
        Settings.from_env({"REDIS_URL": "redis+cluster://h1:7000", "RUNLOG_REDIS_SSL_CERTFILE": "c.pem"})
    Settings.from_env({"REDIS_URL": "rediss+cluster://h1:7000", "RUNLOG_REDIS_SSL_CERTFILE": "c.pem"})


def test_a_standalone_url_still_makes_a_standalone_client() -> None:
    s = Settings.from_env({"REDIS_URL": "redis://127.0.0.1:1/0"})
    c = redis_client(s)
    assert isinstance(c, redis.Redis) and not is_cluster(c)
    pooled = redis_client(s, max_connections=8)
    assert isinstance(pooled.connection_pool, redis.BlockingConnectionPool)
    assert pooled.connection_pool.max_connections == 8


def test_the_index_shard_function_is_pinned() -> None:
    assert INDEX_SHARDS == 16
    assert [index_shard(x) for x in ("run-1", "run-42", "a" * 64)] == [3, 2, 5]


def test_a_redis_url_with_an_option_the_client_does_not_take_is_refused_by_name() -> None:
    from runlog.schemas import ConfigError, Settings
    from runlog.schemas._redis import url_options_refused

    assert url_options_refused("redis://h:1/0?socket_timeout=3&health_check_interval=5&db=2") == []
    assert url_options_refused("redis://h:1/0?cluster=true&zz=1") == ["cluster", "zz"]
    with pytest.raises(ConfigError, match=r"\?cluster= .*redis\+cluster://"):
        Settings.from_env({"REDIS_URL": "redis://127.0.0.1:6379/0?cluster=true"})
    with pytest.raises(ConfigError, match=r"unknown query option.*bogus"):
        Settings.from_env({"REDIS_URL": "rediss://127.0.0.1:6379/0?bogus=1"})
    assert Settings.from_env({"REDIS_URL": "redis://127.0.0.1:6379/0?socket_timeout=3"}).redis_url.endswith("=3")
