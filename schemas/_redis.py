"""The one place Redis clients are built: standalone Redis or Redis Cluster, from ``REDIS_URL``.

``redis://`` / ``rediss://`` / ``unix://`` give redis-py's ``Redis`` (as before);
``redis+cluster://host:port[,host:port...]`` (``rediss+cluster://`` for TLS) gives
``redis.cluster.RedisCluster`` (sync) or ``redis.asyncio.cluster.RedisCluster`` (asyncio), bootstrapped
from the listed nodes (any subset of the cluster's nodes; it discovers the rest). A cluster has
only database 0, so a cluster URL carries no ``/db`` path. AUTH comes from the URL's user info or
``RUNLOG_REDIS_USERNAME`` / ``RUNLOG_REDIS_PASSWORD``, TLS settings from ``RUNLOG_REDIS_SSL_*``.

Global (not per-run) indexes are split into :data:`INDEX_SHARDS` hash-tagged shards on a
cluster (:func:`index_shard`), so every script and transaction touches one slot.
"""

from __future__ import annotations

import asyncio
import time
import zlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar
from urllib.parse import unquote, urlsplit

import redis
import redis.asyncio
import redis.asyncio.cluster
import redis.cluster

from runlog.schemas.errors import ConfigError

__all__ = [
    "CLUSTER_SCHEMES",
    "INDEX_SHARDS",
    "AsyncFailoverCluster",
    "FailoverCluster",
    "aredis_client",
    "aretry_failover",
    "cluster_nodes",
    "index_shard",
    "is_cluster",
    "is_cluster_url",
    "redis_client",
    "retry_failover",
    "url_options_refused",
]

CLUSTER_SCHEMES = ("redis+cluster://", "rediss+cluster://")

#: How many shards a global index is split into on Redis Cluster (each shard is a hash tag
#: ``{idx:<n>}``, so its keys share a slot). Fixed: every writer and reader must agree on it.
INDEX_SHARDS = 16


def is_cluster_url(url: str) -> bool:
    """Whether ``url`` names a Redis Cluster (``redis+cluster://`` or ``rediss+cluster://``)."""
    return url.startswith(CLUSTER_SCHEMES)


def index_shard(member: str) -> int:
    """The shard (0..INDEX_SHARDS-1) a global index entry lives in: CRC-32 of the member (a run
    id, a delivery key)."""
    return zlib.crc32(member.encode("utf-8")) % INDEX_SHARDS


def url_options_refused(url: str) -> list[str]:
    """The query options of a ``redis://``, ``rediss://`` or ``unix://`` URL that redis-py's connection
    does not take (it would fail with a ``TypeError`` at the first connection), sorted."""
    import inspect
    from urllib.parse import parse_qs, urlsplit

    import redis.connection

    names = set(redis.connection.URL_QUERY_ARGUMENT_PARSERS)
    for cls in (redis.connection.AbstractConnection, redis.connection.Connection,
                redis.connection.SSLConnection, redis.connection.UnixDomainSocketConnection,
                redis.connection.ConnectionPool):
        names.update(inspect.signature(cls.__init__).parameters)
    names.update({"db", "ssl_cert_reqs", "ssl_ca_certs", "ssl_certfile", "ssl_keyfile"})
    query = parse_qs(urlsplit(url).query, keep_blank_values=True)
    return sorted(k for k in query if k not in names)


def is_cluster(client: Any) -> bool:
    """Whether ``client`` (or pipeline) talks to a Redis Cluster."""
    return isinstance(client, redis.cluster.RedisCluster | redis.asyncio.cluster.RedisCluster
                      | redis.asyncio.cluster.ClusterPipeline)


def cluster_nodes(url: str) -> tuple[list[tuple[str, int]], str | None, str | None, bool]:
    """``(nodes, username, password, tls)`` of a cluster URL.

    Raises:
        ConfigError: not a cluster URL, no node, a node without a valid port, or a database path.
    """
    if not is_cluster_url(url):
        raise ConfigError("not a redis+cluster:// URL")
    tls = url.startswith("rediss+cluster://")
    rest = url.split("://", 1)[1]
    userinfo, _, hosts = rest.rpartition("@")
    hosts, _, path = hosts.partition("/")
    if path.strip("0"):
        raise ConfigError("a redis+cluster:// URL has no database (a cluster has only db 0)")
    username = password = None
    if userinfo:
        user, sep, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if sep else None
    nodes: list[tuple[str, int]] = []
    for h in hosts.split(","):
        h = h.strip()
        if not h:
            continue
        parts = urlsplit("//" + h)
        try:
            port = parts.port or 6379
        except ValueError as err:
            raise ConfigError(f"redis+cluster:// node {h!r}: {err}") from err
        if not parts.hostname:
            raise ConfigError(f"redis+cluster:// node {h!r} has no host")
        nodes.append((parts.hostname, port))
    if not nodes:
        raise ConfigError("a redis+cluster:// URL needs at least one host:port")
    return nodes, username, password, tls


T = TypeVar("T")

_RETRY_ERRORS: tuple[type[Exception], ...] = tuple(redis.cluster.RedisCluster.ERRORS_ALLOW_RETRY)


def _backoff(attempt: int) -> float:
    return float(min(0.05 * 2 ** attempt, 0.5))


def retry_failover(window_s: float, once: Callable[[], T]) -> T:
    """``once()``, again with backoff while it raises an error redis-py retries on a cluster
    (connection lost, timeout, cluster down, slot not covered), until ``window_s`` has passed since
    the first such error; then that error is raised."""
    deadline: float | None = None
    attempt = 0
    while True:
        try:
            return once()
        except _RETRY_ERRORS:
            now = time.monotonic()
            deadline = now + window_s if deadline is None else deadline
            if now >= deadline:
                raise
            time.sleep(min(_backoff(attempt), deadline - now))
            attempt += 1


async def aretry_failover(window_s: float, once: Callable[[], Awaitable[T]]) -> T:
    """:func:`retry_failover` for a coroutine function, awaiting the backoff."""
    deadline: float | None = None
    attempt = 0
    while True:
        try:
            return await once()
        except _RETRY_ERRORS:
            now = time.monotonic()
            deadline = now + window_s if deadline is None else deadline
            if now >= deadline:
                raise
            await asyncio.sleep(min(_backoff(attempt), deadline - now))
            attempt += 1


class FailoverCluster(redis.cluster.RedisCluster):
    """redis-py's cluster client, whose commands also wait out a master's failover: redis-py
    retries a command on a connection error at once, a few times within milliseconds, while a
    replica takes seconds to be promoted. This client retries the errors redis-py itself retries
    with backoff until ``failover_s`` has passed (:func:`retry_failover`). Pipelines are retried
    by their callers (:func:`runlog.producers.base._redis_io.pipelined`, the projector's batch)."""

    def __init__(self, *args: Any, failover_s: float = 20.0, **kwargs: Any) -> None:
        self.failover_s = failover_s  # before the client's start: it sends commands already
        super().__init__(*args, **kwargs)

    def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        base = super().execute_command
        return retry_failover(self.failover_s, lambda: base(*args, **kwargs))  # type: ignore[no-untyped-call]


class AsyncFailoverCluster(redis.asyncio.cluster.RedisCluster):
    """:class:`FailoverCluster` for asyncio: the same retry window, awaiting the backoff."""

    def __init__(self, *args: Any, failover_s: float = 20.0, **kwargs: Any) -> None:
        self.failover_s = failover_s  # before the client's start: it sends commands already
        super().__init__(*args, **kwargs)

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        base = super().execute_command
        return await aretry_failover(self.failover_s, lambda: base(*args, **kwargs))


def _cluster_kwargs(settings: Any, aio: bool) -> tuple[list[tuple[str, int]], dict[str, Any]]:
    nodes, username, password, tls = cluster_nodes(settings.redis_url)
    kw: dict[str, Any] = {"decode_responses": False}
    if username or settings.redis_username:
        kw["username"] = settings.redis_username or username
    if password or settings.redis_password:
        kw["password"] = settings.redis_password or password
    if tls:
        kw["ssl"] = True
        kw["ssl_check_hostname"] = settings.redis_ssl_check_hostname
        opts = {"ssl_ca_certs": settings.redis_ssl_ca_certs, "ssl_ca_data": settings.redis_ssl_ca_pem,
                "ssl_certfile": settings.redis_ssl_certfile, "ssl_keyfile": settings.redis_ssl_keyfile}
        if not aio:  # the asyncio cluster client takes no key passphrase
            opts["ssl_password"] = settings.redis_ssl_key_password
        kw.update({k: v for k, v in opts.items() if v})
    return nodes, kw


def _failover_s(settings: Any) -> float:
    return max(int(getattr(settings, "redis_failover_ms", 20_000)), 0) / 1000


def redis_client(settings: Any, *, max_connections: int | None = None, timeout: float = 30,
                 **extra: Any) -> Any:
    """A sync client for ``settings.redis_url``: ``redis.Redis`` or ``redis.cluster.RedisCluster``.

    ``max_connections``: a blocking pool of that many connections (per node on a cluster), where a
    caller waits up to ``timeout`` seconds for a free one; None: redis-py's default pool.
    ``extra``: more client keyword arguments (e.g. ``socket_timeout``).
    """
    if is_cluster_url(settings.redis_url):
        nodes, kw = _cluster_kwargs(settings, aio=False)
        kw.update(extra)
        if max_connections is not None:
            # per node; a caller waits for a free connection (BlockingConnectionPool's own 20 s: the
            # cluster client passes no pool timeout through)
            kw.update(connection_pool_class=redis.BlockingConnectionPool, max_connections=max_connections)
        return FailoverCluster(startup_nodes=[redis.cluster.ClusterNode(h, p)  # type: ignore[no-untyped-call]
                                              for h, p in nodes],
                               failover_s=_failover_s(settings), **kw)
    if max_connections is None:
        return redis.Redis.from_url(settings.redis_url, **settings.redis_kwargs(), **extra)
    pool = redis.BlockingConnectionPool.from_url(settings.redis_url, max_connections=max_connections,
                                                 timeout=timeout, **settings.redis_kwargs(), **extra)
    return redis.Redis(connection_pool=pool)


def aredis_client(settings: Any, *, max_connections: int = 256, timeout: float | None = 30) -> Any:
    """An asyncio client for ``settings.redis_url``: ``redis.asyncio.Redis`` on a blocking pool
    (a caller waits up to ``timeout`` seconds for a free connection; None: no limit), or
    ``redis.asyncio.cluster.RedisCluster`` (``max_connections`` per node)."""
    if is_cluster_url(settings.redis_url):
        nodes, kw = _cluster_kwargs(settings, aio=True)
        return AsyncFailoverCluster(startup_nodes=[redis.asyncio.cluster.ClusterNode(h, p) for h, p in nodes],
                                    max_connections=max_connections, failover_s=_failover_s(settings), **kw)
    pool = redis.asyncio.BlockingConnectionPool.from_url(settings.redis_url, max_connections=max_connections,
                                                         timeout=timeout, **settings.redis_kwargs())
    return redis.asyncio.Redis(connection_pool=pool)
