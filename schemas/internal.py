"""What Runlog's own packages use of the contract beyond its public names: for them, not a stable API.

Trace context headers, Redis and Kafka helpers, the event hash's version and other constants of the
contract. An application imports :mod:`runlog.schemas` instead. The names whose module imports a driver
(Kafka, Redis, fastavro) are imported on first use (PEP 562), so importing this module loads none.
"""

from typing import TYPE_CHECKING

from runlog.schemas._env import kafka_env_name
from runlog.schemas._hash import HASH_VERSION
from runlog.schemas._lazy import lazy_names
from runlog.schemas._plain import PlainMapping
from runlog.schemas._tokens import TOKEN_EXTEND, TOKEN_RELEASE
from runlog.schemas._tracecontext import (
    TRACEPARENT,
    TRACESTATE,
    TraceContext,
    carrying,
    current,
    distinct_contexts,
    from_headers,
    parse,
)
from runlog.schemas._types import (
    CHILD_RUN_ATTRIBUTE,
    CHILD_TOOL,
    CHILDREN_ATTRIBUTE,
    PARENT_CALL_ATTRIBUTE,
    STAGES_ATTRIBUTE,
    SUBJECT_ATTRIBUTE,
)
from runlog.schemas.errors import causes

if TYPE_CHECKING:
    from runlog.schemas._client_config import quiet_unreachable_lines
    from runlog.schemas._codec import body_of
    from runlog.schemas._kafka import (
        RETRIABLE_METADATA_ERRORS,
        commit_refused_by_rebalance,
        partitions_of,
        watermarks,
    )
    from runlog.schemas._kafka_auth import awaited, quiet_auth_lines, refused, served
    from runlog.schemas._redis import (
        INDEX_SHARDS,
        AsyncFailoverCluster,
        aredis_client,
        aretry_failover,
        index_shard,
        is_cluster,
        is_cluster_url,
        redis_client,
        retry_failover,
    )
    from runlog.schemas._schema_log import publish_bundled_schemas

_LAZY = {
    **dict.fromkeys(("body_of",),
                    "runlog.schemas._codec"),
    **dict.fromkeys(("quiet_unreachable_lines",),
                    "runlog.schemas._client_config"),
    **dict.fromkeys(("RETRIABLE_METADATA_ERRORS", "commit_refused_by_rebalance", "partitions_of",
                     "watermarks"),
                    "runlog.schemas._kafka"),
    **dict.fromkeys(("awaited", "quiet_auth_lines", "refused", "served"),
                    "runlog.schemas._kafka_auth"),
    **dict.fromkeys(("publish_bundled_schemas",),
                    "runlog.schemas._schema_log"),
    **dict.fromkeys(("AsyncFailoverCluster", "INDEX_SHARDS", "aredis_client", "aretry_failover",
                     "index_shard", "is_cluster", "is_cluster_url", "redis_client", "retry_failover"),
                    "runlog.schemas._redis"),
}
"""The names whose module imports a driver, by module."""

__getattr__, __dir__ = lazy_names(__name__, _LAZY)


__all__ = [
    "CHILDREN_ATTRIBUTE",
    "CHILD_RUN_ATTRIBUTE",
    "CHILD_TOOL",
    "HASH_VERSION",
    "INDEX_SHARDS",
    "PARENT_CALL_ATTRIBUTE",
    "RETRIABLE_METADATA_ERRORS",
    "STAGES_ATTRIBUTE",
    "SUBJECT_ATTRIBUTE",
    "TOKEN_EXTEND",
    "TOKEN_RELEASE",
    "TRACEPARENT",
    "TRACESTATE",
    "AsyncFailoverCluster",
    "PlainMapping",
    "TraceContext",
    "aredis_client",
    "aretry_failover",
    "awaited",
    "body_of",
    "carrying",
    "causes",
    "commit_refused_by_rebalance",
    "current",
    "distinct_contexts",
    "from_headers",
    "index_shard",
    "is_cluster",
    "is_cluster_url",
    "kafka_env_name",
    "lazy_names",
    "parse",
    "partitions_of",
    "publish_bundled_schemas",
    "quiet_auth_lines",
    "quiet_unreachable_lines",
    "redis_client",
    "refused",
    "retry_failover",
    "served",
    "watermarks",
]
