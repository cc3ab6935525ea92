"""Test fixtures: a real Kafka broker and a real Redis for the whole session.

Where they come from, in order:

1. ``KAFKA_BOOTSTRAP_SERVERS`` and ``REDIS_URL`` when both are set;
2. testcontainers, when a Docker engine answers;
3. the local services ``deploy/local/up`` starts (real Apache Kafka in KRaft mode
   from Maven jars, Debian's redis-server).

Every test that asks for ``settings`` gets its own topic prefix and Redis key
prefix, so tests never see each other's data. Each such namespace is removed when the fixture that
handed it out is torn down (its topics, every Redis key that starts with its Redis prefix: the
namespace ``<prefix>:`` and the namespaces beside it such as the rebuild target ``<prefix>.rebuild:``,
and the projector's ``<group>-data`` directories), and the session fails at its end if any of them
still holds something (:func:`services`).
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess
import time
import uuid
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import redis

from runlog.schemas._redis import is_cluster
from runlog.schemas._redis import redis_client as _redis_client
from runlog.schemas.settings import Settings

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Services:
    kafka_bootstrap_servers: str
    redis_url: str
    source: str


def _docker_answers() -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        r = subprocess.run(["docker", "info"], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return r.returncode == 0


def _from_local_up() -> Services:
    proc = subprocess.run(
        [str(ROOT / "deploy" / "local" / "up")],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
        env={k: v for k, v in os.environ.items()
             if k not in ("KAFKA_BOOTSTRAP_SERVERS", "REDIS_URL")},
    )
    if proc.returncode != 0:
        pytest.exit(f"deploy/local/up failed ({proc.returncode}):\n{proc.stderr[-4000:]}", 3)
    found: dict[str, str] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("export ") and "=" in line:
            k, v = line[len("export "):].split("=", 1)
            found[k] = v.strip().strip("'\"")
    return Services(found["KAFKA_BOOTSTRAP_SERVERS"], found["REDIS_URL"], "deploy/local")


@contextmanager
def _start_services() -> Iterator[Services]:
    env_kafka = os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
    env_redis = os.environ.get("REDIS_URL")
    if env_kafka and env_redis:
        yield Services(env_kafka, env_redis, "environment")
        return
    if _docker_answers():  # pragma: no cover - no Docker engine on the CI machine
        from testcontainers.kafka import KafkaContainer
        from testcontainers.redis import RedisContainer

        with KafkaContainer("apache/kafka:4.1.1").with_kraft() as kafka, \
                RedisContainer("redis:7") as red:
            url = f"redis://{red.get_container_host_ip()}:{red.get_exposed_port(6379)}/0"
            yield Services(kafka.get_bootstrap_server(), url, "testcontainers")
        return
    yield _from_local_up()


# -- running in parallel (pytest-xdist) ------------------------------------------------------------

XDIST_GROUPS: dict[str, str] = {
    # one Redis Cluster per session (started and stopped by its session fixture); some tests kill or
    # stop its nodes, which the other cluster tests must not see
    "tests/integration/cluster/": "redis-cluster",
    # one Schema Registry server (a JVM) per session, started and stopped by its session fixture
    "tests/integration/schemas/test_registry_mode.py": "schema-registry",
    # one SASL/TLS broker (a JVM) per worker, started by the session fixture ``secure_broker`` of the
    # first test that asks for it: every module using it in one group, or each worker starts its own
    "tests/integration/processors/test_projector_settings_sasl.py": "sasl-broker",
    "tests/integration/processors/test_wrong_credentials.py": "sasl-broker",
    "tests/integration/processors/test_acl_and_runs.py": "sasl-broker",
    # one Vault dev server per module (its tests wait for deploy/local/vault's build on a first run)
    "tests/integration/resume/test_transit_vault.py": "vault",
    # the audit world (a demo run and more) is built once per package
    "tests/integration/audit/": "audit-world",
    # one mypy run (a module fixture, about 10 s of CPU) checks every snippet: in one worker, not one per
    # worker its tests land on (three in a CI-like run)
    "tests/unit/producers/test_protocol_types.py": "<module>",
    # each fault module gathers its points in module state and writes its section of the fault report
    # from them (test_bad_input's last test reads what the others saw): a module stays in one worker
    "tests/faults/": "<module>",
}
"""Tests that share an expensive or stateful service run in one xdist worker, one after the other:
path prefix (from the repository root) -> group (``<module>``: one group per test file). Applied by the
scheduler below under ``--dist loadgroup`` (pytest 9 ignores the ``xdist_group`` marker: xdist renames
``item._nodeid``, which pytest 9 no longer reads)."""

SERIAL: dict[str, str] = {
    "tests/faults/test_infrastructure.py": "private Redis and broker on fixed ports, restarted by the tests",
    "tests/faults/test_cluster.py": "a three-broker cluster on fixed ports, 1,000 runs on 48 threads",
    "tests/faults/test_network.py": "partitions timed against leases and session timeouts, a private broker "
    "and Toxiproxy: another test's load would stretch what they time",
    "tests/integration/resume/test_resumer_process_claims.py": "a static member must rejoin within the "
    "10 s session timeout, which a loaded machine's process start-up can miss",
    "tests/faults/test_chaos.py": "a private broker, Redis and Toxiproxy on fixed ports, faulted on a timer "
    "for minutes: another test's load would stretch the leases and timeouts the faults are timed against",
    "tests/integration/fleet/test_queues.py": "queue slots refreshed on a timer shorter than the 3 s lease, "
    "and the fleet's shares measured while two workers dispatch: another test's load stretches both",
    "tests/integration/fleet/test_acceptance.py": "the share of the provider's token limit the fleet uses is "
    "measured: another test's load on the two cores would slow the workers below the limit",
    "tests/integration/projections/test_redis_store.py::TestRedisStore::test_script_reloaded_after_flush":
    "SCRIPT FLUSH on the shared Redis: a test beside it lost its scripts between redis-py's reload and its "
    "EVALSHA (the bench smoke test's effects ledger failed with NoScriptError in a CI-like run)",
    "tests/integration/bench/test_raw_projector.py::test_a_flushed_script_cache_is_loaded_again_by_the_baseline_"
    "and_the_watcher": "SCRIPT FLUSH on the shared Redis before every batch: as above",
    "tests/unit/bench/test_openloop_speed.py::test_the_speed_index_agrees_with_itself": "two CPU "
    "calibrations must agree within 25%: under the parallel run's load (7 busy processes on 2 cores) "
    "their CPU times differed by 40%",
}
"""Tests marked ``serial``: ``deploy/test`` runs them after the parallel run, alone or in one of two
lanes (:data:`SERIAL_LANES`). Path prefix (or a test's ``path::name``) -> why."""

SERIAL_LANES: dict[str, int] = {
    # lane 1: the chaos run (44% of the two cores, measured with vmstat over a CI-like run), the
    # three-broker cluster (61%) and the broker and Redis restarts (12-39%), each on services of its own
    "tests/faults/test_chaos.py": 1,
    "tests/faults/test_cluster.py": 1,
    "tests/faults/test_infrastructure.py": 1,
    # lane 2: waits on timers and a rate limit that leave the cores mostly idle: the network matrix
    # (17%), the fleet acceptance (16%, paced by its provider's limit), the queues and static members
    "tests/faults/test_network.py": 2,
    "tests/integration/fleet/": 2,
    "tests/integration/resume/test_resumer_process_claims.py": 2,
}
"""The serial tests ``deploy/test`` runs in two lanes side by side (``--serial-lane 1`` and ``2``, two
pytest processes): each lane is one test at a time, and the two together kept the machine under 80%
busy, where a lane's timings have the room they need. A serial test in no lane (lane 0: the ``SCRIPT
FLUSH`` tests of the shared Redis, the CPU calibration) runs before the lanes, with nothing beside it."""


def serial_lane(node: str) -> int:
    """The lane of a serial test (its ``path::name`` from the repository root): 1, 2, or 0 (alone)."""
    return next((lane for p, lane in SERIAL_LANES.items() if node.startswith(p)), 0)


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--serial-lane", type=int, choices=(0, 1, 2), default=None,
                     help="keep only the serial tests of this lane (tests/conftest.py SERIAL_LANES; 0: the "
                          "ones that run alone); deploy/test runs lanes 1 and 2 side by side")


def xdist_group(nodeid: str) -> str | None:
    """The group of a test (its node id or path) in :data:`XDIST_GROUPS`, if any."""
    path = nodeid.split("::", 1)[0]
    group = next((g for p, g in XDIST_GROUPS.items() if path.startswith(p)), None)
    return path if group == "<module>" else group


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """``--dist loadgroup``: xdist's scope scheduling with :func:`xdist_group` as the scope (a test in no
    group is a scope of its own, as under ``--dist load``); larger groups are handed out first."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return xdist_group(nodeid) or nodeid

    return GroupScheduling(config, log)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    lane = config.getoption("--serial-lane")
    kept, dropped = [], []
    for item in items:
        node = _node(item)  # None: a test file written elsewhere (tests/integration/test_namespaces.py does)
        serial = node is not None and any(node.startswith(p) for p in SERIAL)
        if serial:
            item.add_marker(pytest.mark.serial)
        in_lane = lane is None or (serial and serial_lane(node or "") == lane)
        (kept if in_lane else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


def _node(item: pytest.Item) -> str | None:
    """A test's ``path::name`` from the repository root (None for a test file outside it)."""
    path = Path(str(item.path)).resolve()
    if not path.is_relative_to(ROOT):
        return None
    rel = path.relative_to(ROOT).as_posix()
    return rel + item.nodeid[item.nodeid.index("::"):] if "::" in item.nodeid else rel


# -- skips that CI does not accept ------------------------------------------------------------------

def in_ci() -> bool:
    """``CI`` is set to a true value (``.ci/run`` sets ``CI=true``)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes", "on")


def require(condition: object, reason: str) -> None:
    """Go on when ``condition`` holds; otherwise skip the test with ``reason`` on a developer's machine,
    but **fail** it under CI (:func:`in_ci`). For what ``deploy/`` provides on a CI machine (Kafka, Redis,
    the Redis Cluster, the SASL broker's Java and jars, Chromium, the Schema Registry, openssl, the test
    extra's packages): a CI run that skipped such a test would be green without having exercised it.
    The skips that remain (none of them about a missing tool) are listed in ``docs/testing.md``."""
    if condition:
        return
    if in_ci():
        pytest.fail(f"{reason} (CI=true: deploy/ provides this on a CI machine, so a skip would hide a "
                    "test that did not run)", pytrace=False)
    pytest.skip(reason)


def require_module(name: str, reason: str) -> Any:
    """The module ``name``, imported; when it cannot be, :func:`require` with ``reason``."""
    import importlib

    try:
        return importlib.import_module(name)
    except ImportError as err:
        require(False, f"{reason} ({err})")


@pytest.fixture(scope="session")
def services() -> Iterator[Services]:
    """Kafka and Redis addresses for the session (see the module docstring).

    Its teardown comes after every fixture that used them: the session fails there (an error at
    the teardown of its last test) when a namespace it handed out still holds a topic, a Redis key
    or a projector data directory (:func:`leftovers`)."""
    with _start_services() as found:
        yield found
        left = leftovers(list(_HANDED_OUT.values()),
                         must_answer={found.redis_url, found.kafka_bootstrap_servers})
        if left:
            pytest.fail(f"{len(left)} of the {len(_HANDED_OUT)} namespaces this session handed out "
                        f"were not removed at teardown (first: {left[0]}):\n"
                        + "\n".join(str(x) for x in left[:20]),
                        pytrace=False)


@pytest.fixture
def test_id() -> str:
    return uuid.uuid4().hex[:10]


@pytest.fixture
def settings(services: Services, test_id: str, tmp_path: Path) -> Iterator[Settings]:
    """Settings private to one test: its own topic prefix, Redis prefix and artifact root."""
    s = Settings.from_env(
        {},
        kafka_bootstrap_servers=services.kafka_bootstrap_servers,
        redis_url=services.redis_url,
        topic_prefix=f"t{test_id}.",
        redis_prefix=f"t{test_id}",
        partitions=12,
        artifact_root=str(tmp_path / "artifacts"),
        lease_ttl_ms=3000,
        metrics_port=0,
    )
    claim(s)
    yield s
    _cleanup(s)


# -- namespaces: what a fixture hands out, it removes ---------------------------------------------

_HANDED_OUT: dict[tuple[str, str, str, str], Settings] = {}
"""Every namespace (broker, topic prefix, Redis URL, Redis prefix) fixtures handed out this session."""


def _namespace(s: Settings) -> tuple[str, str, str, str]:
    return (s.kafka_bootstrap_servers, s.topic_prefix, s.redis_url, s.redis_prefix)


def claim(s: Settings) -> Settings:
    """Record a namespace a fixture hands out: the end of the session checks it is empty."""
    assert s.topic_prefix and s.redis_prefix, "a test namespace needs a topic and a Redis prefix"
    _HANDED_OUT.setdefault(_namespace(s), s)
    return s


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any],
                         request: pytest.FixtureRequest) -> Generator[None, object, object]:
    """A fixture that returns ``Settings`` inside a claimed namespace but on other services or
    under a longer prefix (the Redis Cluster tests' ``settings``, say) gets the same cleanup."""
    value = yield
    if isinstance(value, Settings) and _namespace(value) not in _HANDED_OUT and any(
            value.topic_prefix.startswith(c.topic_prefix) and value.redis_prefix.startswith(c.redis_prefix)
            for c in list(_HANDED_OUT.values())):
        claim(value)
        fixturedef.addfinalizer(lambda: _cleanup(value))
    return value


def _key_pattern(prefix: str) -> str:
    """The SCAN pattern of a test's Redis keys: ``<prefix>*``, so ``<prefix>:*`` and the namespaces
    tests and tools derive from it (``<prefix>.rebuild:*``, ``<prefix>.ref:*``, ``<prefix>copy1:*``).
    A prefix handed out here is ``t`` and 10 random hex digits: no other test's keys start with it."""
    return re.sub(r"([*?\[\]\\])", r"\\\1", prefix) + "*"


def _scan(client: Any, pattern: str) -> list[bytes]:
    """Every key matching ``pattern``; on a Redis Cluster, on every master."""
    kw: dict[str, Any] = {"target_nodes": client.PRIMARIES} if is_cluster(client) else {}
    return list(client.scan_iter(match=pattern, count=1000, **kw))


def _topics_under(admin: Any, prefix: str) -> list[str]:
    return sorted(t for t in admin.list_topics(timeout=15).topics if t.startswith(prefix))


def _data_dirs(s: Settings) -> list[Path]:
    """The projector's Faust data directories (``<group id>-data``, in the working directory of the
    processes the tests start, the repository root); every group id starts with the topic prefix."""
    return [d for d in ROOT.glob(f"{glob.escape(s.topic_prefix)}*-data") if d.is_dir()]


def _cleanup(s: Settings) -> None:
    """Remove a namespace: its topics (waiting for the broker to confirm), every key of it and of
    its sibling namespaces (the subprocess workers' keys too: they share the prefix), its projector
    data directories."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient

    assert s.topic_prefix and s.redis_prefix, "refusing to clean a namespace without prefixes"
    admin = AdminClient(s.admin_config())
    mine = _topics_under(admin, s.topic_prefix)
    if mine:
        for fut in admin.delete_topics(mine, operation_timeout=30).values():
            try:
                fut.result(60)
            except KafkaException as e:
                if e.args[0].code() != KafkaError.UNKNOWN_TOPIC_OR_PART:
                    raise
    r = _redis_client(s)  # a RedisCluster for a redis+cluster:// URL
    try:
        keys = _scan(r, _key_pattern(s.redis_prefix))
        for i in range(0, len(keys), 500):
            r.unlink(*keys[i:i + 500])
    finally:
        r.close()
    for d in _data_dirs(s):
        shutil.rmtree(d, ignore_errors=True)


@dataclass(frozen=True)
class Leftover:
    """What is still in one namespace."""

    namespace: tuple[str, str, str, str]
    topics: list[str]
    keys: list[str]
    dirs: list[str]

    def __str__(self) -> str:
        kafka, tprefix, url, rprefix = self.namespace
        return (f"  topics {tprefix}* on {kafka}: {len(self.topics)} {self.topics[:5]}; "
                f"keys {rprefix}* on {url}: {len(self.keys)} {self.keys[:5]}; "
                f"data dirs: {len(self.dirs)} {self.dirs[:3]}")


def leftovers(namespaces: list[Settings], *, must_answer: set[str] | frozenset[str] = frozenset(),
              wait_s: float = 15.0) -> list[Leftover]:
    """What is left in ``namespaces`` (only in them: other processes' data is not counted). A topic
    deleted a moment ago can still be listed: topics are looked at again for up to ``wait_s``.
    Services that no longer answer are skipped (a Redis Cluster or broker the session started and
    already stopped), unless their URL or bootstrap servers are in ``must_answer``."""
    from confluent_kafka import KafkaException
    from confluent_kafka.admin import AdminClient

    keys: dict[tuple[str, str, str, str], list[str]] = {}
    by_url: dict[str, list[Settings]] = {}
    for s in namespaces:
        by_url.setdefault(s.redis_url, []).append(s)
    for group in by_url.values():
        try:
            r = _redis_client(group[0])
            try:
                found = [k.decode() for k in _scan(r, "*")]  # one pass, however many namespaces
            finally:
                r.close()
        except (redis.ConnectionError, redis.exceptions.RedisClusterException):
            if group[0].redis_url in must_answer:
                raise
            continue
        for s in group:
            keys[_namespace(s)] = sorted(k for k in found if k.startswith(s.redis_prefix))

    def topics_left() -> dict[tuple[str, str, str, str], list[str]]:
        out: dict[tuple[str, str, str, str], list[str]] = {}
        names: dict[str, list[str]] = {}
        for s in namespaces:
            if s.kafka_bootstrap_servers not in names:
                try:
                    names[s.kafka_bootstrap_servers] = list(
                        AdminClient(s.admin_config()).list_topics(timeout=15).topics)
                except KafkaException:
                    if s.kafka_bootstrap_servers in must_answer:
                        raise
                    names[s.kafka_bootstrap_servers] = []
            out[_namespace(s)] = sorted(t for t in names[s.kafka_bootstrap_servers]
                                        if t.startswith(s.topic_prefix))
        return out

    deadline = time.monotonic() + wait_s
    topics = topics_left() if namespaces else {}
    while any(topics.values()) and time.monotonic() < deadline:
        time.sleep(1.0)
        topics = topics_left()
    left = []
    for s in namespaces:
        ns = _namespace(s)
        t, k, d = topics.get(ns, []), keys.get(ns, []), [str(x) for x in _data_dirs(s)]
        if t or k or d:
            left.append(Leftover(ns, t, k, d))
    return left


@pytest.fixture
def topics(settings: Settings) -> Settings:
    """``settings`` with Runlog's topics created on the broker."""
    from runlog.processors.admin import ensure_topics

    reports = ensure_topics(settings)
    assert all(r.action == "created" for r in reports), reports
    return settings


@pytest.fixture
def redis_client(settings: Settings) -> Iterator[redis.Redis]:
    client: redis.Redis = _redis_client(settings)
    yield client
    client.close()
