"""Schedules on the log, their Redis projection, and the ticker the resumer members run.

**The book** (:class:`ScheduleBook`). A schedule is a record on the compacted topic
``runlog.schedules`` (key: the schedule's name; value: :meth:`Schedule.to_json`; a tombstone removes
it), acknowledged by the broker (``acks=all``, idempotent producer) before a command returns. Redis
holds the projection: hash ``P:schedules`` (name -> JSON), whole when ``P:schedules:synced`` is set;
a reader that finds the marker missing (Redis lost or flushed) replays the topic into it first, so
Redis can always be rebuilt from the log. ``P:schedules:last`` (name -> ms) is the latest tick
handled, only ever moved forward; lost with Redis, a schedule counts from its creation again under
its catch-up policy: a tick whose run was started resolves to that run (its idempotency key), but a
tick that was skipped (``none``, or older than ``one`` keeps) may then be started.

**The ticker** (:class:`Ticker`). Every resumer member (``runlog resumer``) runs one. Every
:attr:`Ticker.interval_s` the member that takes the group's turn (``P:schedules:turn:<group>``,
``SET NX PX``, like the sweep's) looks at every active schedule whose workflow its App registers
and starts the runs of its due ticks (:meth:`Schedule.due`: on-time ticks, and missed ones by the
catch-up policy): ``start_run(..., idempotency_key="schedule:<name>:<tick ms>")`` (exactly once:
the run id is derived from the key and the claim is checked against the log), releases the run's
lease and asks the group to resume it (the run is executed by whichever member owns its partition,
not in the ticker). A member paused while it holds the turn loses it when it expires; if it wakes
up and starts the same tick, the key resolves to the run already started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import time
from collections.abc import Callable, Iterable
from typing import Any

import redis
from confluent_kafka import Producer

from runlog.producers import Runner, Schedule
from runlog.producers.internal import ERASED_TEXT, text_sealer
from runlog.schemas import Settings
from runlog.schemas.errors import (
    ConfigError,
    PayloadKeyError,
    RunConflict,
    RunlogError,
    WorkflowDefinitionError,
)
from runlog.schemas.internal import redis_client
from runlog.schemas.topics import Topics

__all__ = ["ScheduleBook", "ScheduleNotFound", "Ticker", "schedules_topic"]

log = logging.getLogger("runlog.schedules")

_MAX_FORWARD = """
local cur = redis.call('HGET', KEYS[1], ARGV[1])
if not cur or tonumber(cur) < tonumber(ARGV[2]) then
  redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
  return 1
end
return 0
"""


class ScheduleNotFound(RunlogError):
    """No schedule of that name is on the log."""


def schedules_topic(settings: Settings) -> str:
    """The compacted topic of the schedules (under the topic prefix; one partition)."""
    return Topics.of(settings).schedules


class ScheduleBook:
    """The schedules: records on the log, a rebuildable hash in Redis.

    Args:
        settings: the broker, Redis and prefixes.
        client: a Redis client (one is made from ``settings`` and closed with the book when None).
    """

    def __init__(self, settings: Settings, client: redis.Redis | None = None) -> None:
        self.settings = settings
        self.topic = schedules_topic(settings)
        self._own = client is None
        self.redis = client if client is not None else redis_client(settings)
        p = settings.redis_prefix
        # one hash tag: the rebuild replaces the hash and sets its marker in one transaction, which a
        # Redis Cluster allows only for keys of one slot
        self.key = f"{p}:{{schedules}}"
        self.synced_key = f"{p}:{{schedules}}:synced"
        self.last_key = f"{p}:{{schedules}}:last"
        self._producer: Producer | None = None
        self._forward = self.redis.register_script(_MAX_FORWARD)
        self._texts = text_sealer(settings)
        """With encryption on, a schedule's params are sealed (under the default subject) on the topic
        and in Redis: ``params`` empty, ``params_sealed`` the sealed JSON."""

    def _encode(self, schedule: Schedule) -> str:
        raw = schedule.to_json()
        if self._texts is None or not schedule.params:
            return raw
        doc = json.loads(raw)
        doc["params_sealed"] = self._texts.seal(None, json.dumps(doc.pop("params"), sort_keys=True))
        doc["params"] = {}
        return json.dumps(doc, sort_keys=True)

    def _decode(self, raw: str | bytes) -> Schedule:
        doc = json.loads(raw)
        sealed = doc.pop("params_sealed", None)
        if sealed is None:  # params in clear (encryption off when it was written)
            return Schedule.from_json(raw)
        opened = self._texts.open(sealed) if self._texts is not None else sealed
        if opened in (sealed, ERASED_TEXT):
            raise PayloadKeyError("?", f"schedule {doc.get('name')!r}: its params are sealed and this "
                                       "process has not their key (RUNLOG_ENCRYPTION and RUNLOG_KEYRING)")
        doc["params"] = json.loads(opened)
        return Schedule.from_json(json.dumps(doc))

    def close(self) -> None:
        if self._producer is not None:
            self._producer.flush(10)
        if self._own:
            self.redis.close()

    def __enter__(self) -> ScheduleBook:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- the log ------------------------------------------------------------------------------

    def _produce(self, name: str, value: bytes | None) -> None:
        if self._producer is None:
            self._producer = Producer(self.settings.producer_config())
        errors: list[Any] = []
        self._producer.produce(self.topic, key=name.encode(), value=value,
                               on_delivery=lambda err, msg: errors.append(err) if err is not None else None)
        if self._producer.flush(30) != 0 or errors:
            raise RunlogError(f"schedule {name!r}: the record was not acknowledged by the broker "
                              f"({errors[0] if errors else 'timed out'})")

    def rebuild(self) -> int:
        """Replay the topic into Redis (the hash replaced, the marker set); how many schedules."""
        from runlog.projections.log_reader import LogReader

        found: dict[str, str] = {}
        with LogReader(self.settings, self.topic, name="runlog-schedules") as reader:
            parts = reader.partitions()
            ranges = {p: lh for p, lh in reader.watermarks(parts).items() if lh[1] > lh[0]}
            for m in reader.records(ranges) if ranges else ():
                if m.key() is None:
                    continue
                name = m.key().decode()
                if m.value() is None:
                    found.pop(name, None)
                else:
                    found[name] = m.value().decode()
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self.key)
        for name, value in found.items():
            pipe.hset(self.key, name, value)
        pipe.set(self.synced_key, "1")
        pipe.execute()
        return len(found)

    # -- reads and writes ---------------------------------------------------------------------

    def _synced(self) -> None:
        if not self.redis.exists(self.synced_key):
            n = self.rebuild()
            log.info("schedules: rebuilt %d from %s", n, self.topic)

    def list(self) -> list[Schedule]:
        """Every schedule, by name."""
        self._synced()
        raw = self.redis.hgetall(self.key)
        return sorted((self._decode(v) for v in raw.values()), key=lambda s: s.name)

    def get(self, name: str) -> Schedule:
        """The schedule ``name``.

        Raises:
            ScheduleNotFound: there is none.
        """
        self._synced()
        raw = self.redis.hget(self.key, name)
        if raw is None:
            raise ScheduleNotFound(f"no schedule named {name!r}")
        return self._decode(raw)

    def put(self, schedule: Schedule) -> Schedule:
        """Record ``schedule`` on the log (acknowledged), then in Redis. A schedule without a
        creation time gets now (its first tick is the first one after it)."""
        if not schedule.created_at_ms:
            schedule = dataclasses.replace(schedule, created_at_ms=_now_ms())
        self._synced()
        value = self._encode(schedule)
        self._produce(schedule.name, value.encode())
        self.redis.hset(self.key, schedule.name, value)
        return schedule

    def set_paused(self, name: str, paused: bool) -> Schedule:
        """Pause or resume ``name``; a resumed schedule counts from now (it does not catch up on the
        ticks of its pause).

        Raises:
            ScheduleNotFound: there is none.
        """
        s = self.get(name)
        if not paused and s.paused:
            self.handled(name, _now_ms())
        return self.put(dataclasses.replace(s, paused=paused))

    def remove(self, name: str) -> None:
        """Remove ``name`` (a tombstone on the log).

        Raises:
            ScheduleNotFound: there is none.
        """
        self.get(name)
        self._produce(name, None)
        pipe = self.redis.pipeline(transaction=False)
        pipe.hdel(self.key, name)
        pipe.hdel(self.last_key, name)
        pipe.execute()

    def declare(self, schedule: Schedule) -> Schedule:
        """An App's declared schedule: recorded when new or changed (clock, workflow, params,
        catch-up), else left as it is (a pause from the CLI stays)."""
        try:
            cur = self.get(schedule.name)
        except ScheduleNotFound:
            return self.put(schedule)
        same = (cur.workflow, dict(cur.params), cur.cron, cur.every, cur.catch_up) == \
            (schedule.workflow, dict(schedule.params), schedule.cron, schedule.every, schedule.catch_up)
        if same:
            return cur
        return self.put(dataclasses.replace(schedule, paused=cur.paused, created_at_ms=cur.created_at_ms))

    def last_handled(self, name: str) -> int | None:
        raw = self.redis.hget(self.last_key, name)
        return None if raw is None else int(raw)

    def handled(self, name: str, tick_ms: int) -> None:
        """``tick_ms`` of ``name`` is handled (never moves back)."""
        self._forward(keys=[self.last_key], args=[name, tick_ms])


def _now_ms() -> int:
    return int(time.time() * 1000)


class Ticker:
    """Starts the runs of due schedule ticks, as one member of a resumer group (see the module
    docstring).

    Args:
        book: the schedules.
        runner: starts the runs (a resumer's runner).
        workflows: the App's registry lookup: name -> workflow (raises for a workflow it lacks).
        names: the workflow names the App registers.
        request: asks the group to resume a run (run id, reason).
        turn_key: the group's ticking turn.
        member: this member's id.
        interval_s: how often the turn is taken.
    """

    def __init__(self, *, book: ScheduleBook, runner: Runner, workflows: Callable[[str], Any],
                 names: Callable[[], Iterable[str]], request: Callable[[str, str], None], turn_key: str,
                 member: str, interval_s: float = 0.5) -> None:
        self.book = book
        self.runner = runner
        self.workflows = workflows
        self.names = names
        self.request = request
        self.turn_key = turn_key
        self.member = member
        self.interval_s = interval_s
        self._last = 0.0
        self.started: list[tuple[str, int, str]] = []
        """``(schedule, tick ms, run id)`` of the runs this member started."""

    def tick(self, now_ms: int | None = None) -> list[str]:
        """Start the runs of due ticks when this member takes the turn; the run ids started."""
        now = time.monotonic()
        if now - self._last < self.interval_s:
            return []
        self._last = now
        turn_ms = max(int(self.interval_s * 1000), 100)
        if not self.book.redis.set(self.turn_key, self.member, nx=True, px=turn_ms):
            return []
        at = now_ms if now_ms is not None else _now_ms()
        mine = set(self.names())
        out: list[str] = []
        for s in self.book.list():
            if s.paused or s.workflow not in mine:
                continue
            for tick in s.due(self.book.last_handled(s.name), at):
                run_id = self._start(s, tick)
                if run_id is not None:
                    out.append(run_id)
                self.book.handled(s.name, tick)
        return out

    def _start(self, s: Schedule, tick: int) -> str | None:
        try:
            wf = self.workflows(s.workflow)
            handle = self.runner.start_run(wf, dict(s.params), idempotency_key=s.run_key(tick))
        except (RunConflict, WorkflowDefinitionError, ConfigError) as err:
            log.warning("schedule %s: tick %d not started: %s", s.name, tick, err)
            return None
        if handle.session is not None:  # new: hand it to the group (its partition's owner runs it)
            with contextlib.suppress(RunlogError):
                handle.session.close(release=True)
            self.request(handle.run_id, f"schedule {s.name} tick {tick}")
            self.started.append((s.name, tick, handle.run_id))
            log.info("schedule %s: tick %d started run %s", s.name, tick, handle.run_id)
        return handle.run_id
