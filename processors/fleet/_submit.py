"""A submission's two durable parts: its key's claim in Redis and its record on the submissions topic.

The run a submission asks for is named by its idempotency key (``run_id_for_key``, as a keyed
``Runner.start_run`` names it), so the key, not the record, decides which run exists: a submission
delivered twice, taken by two workers, or submitted twice with the same key starts one run.

The claim (``{prefix}:submissions:by_key:<lp_sha256(key)>``, canonical JSON ``{"run_id",
"workflow", "params_hash"}``, no TTL) lets :meth:`runlog.Client.submit` refuse the same key with
other parameters at once (``RunConflict``) instead of leaving the conflict to a worker. It is
checked against the run key claim a worker (or any keyed start) writes too, so a key first used
by ``Runner.run`` is the same run. A Redis that lost the claim loses only that early refusal: the
worker's keyed start refuses the conflicting submission then (it is dead-lettered with its reason).
"""

from __future__ import annotations

import json
import threading
from typing import Any

import redis
from confluent_kafka import KafkaError, Message, Producer

from runlog.producers.internal import RunKeys, canonical_json, lp_sha256
from runlog.schemas import Codec, DeliveryError, RunConflict, RunSubmission

__all__ = ["SubmissionKeys", "produce_submission"]


class SubmissionKeys:
    """Claims of submission keys (the module docstring): ``claim`` says whether this call made it."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.prefix = prefix
        self.run_keys = RunKeys(client, prefix)

    def key(self, idempotency_key: str) -> str:
        return f"{self.prefix}:submissions:by_key:{lp_sha256(idempotency_key)}"

    def claim(self, idempotency_key: str, run_id: str, workflow: str, params_hash: str) -> bool:
        """Claim ``idempotency_key`` for this submission; False when it was claimed before with the
        same workflow and parameters (the same run).

        Raises:
            RunConflict: the key names a run of another workflow or other parameters (by an earlier
                submission or a keyed start).
        """
        started = self.client.get(self.run_keys.key(idempotency_key))
        if started is not None:
            found = json.loads(started)
            self._same(idempotency_key, found["run_id"], str(found["workflow"]).split("@", 1)[0],
                       found["params_hash"], workflow, params_hash)
        value = canonical_json({"run_id": run_id, "workflow": workflow, "params_hash": params_hash})
        if self.client.set(self.key(idempotency_key), value, nx=True):
            return started is None
        raw = self.client.get(self.key(idempotency_key))
        if raw is not None:
            found = json.loads(raw)
            self._same(idempotency_key, found["run_id"], found["workflow"], found["params_hash"], workflow,
                       params_hash)
        return False

    @staticmethod
    def _same(key: str, run_id: str, found_workflow: str, found_hash: str, workflow: str,
              params_hash: str) -> None:
        if found_workflow != workflow:
            raise RunConflict(key, run_id, f"it was submitted for workflow {found_workflow}, not {workflow}")
        if found_hash != params_hash:
            raise RunConflict(key, run_id, f"it was submitted with params sha256 {found_hash}, these hash to "
                              f"{params_hash}; use a new key for new parameters")


def produce_submission(producer: Producer, codec: Codec, topic: str, submission: RunSubmission, *,
                       timeout: float = 30.0) -> tuple[int, int]:
    """Produce ``submission`` keyed by its run id and wait for its acknowledgement.

    Returns:
        The record's ``(partition, offset)``.

    Raises:
        DeliveryError: the record was not stored within ``timeout`` seconds.
    """
    done = threading.Event()
    got: dict[str, Any] = {}

    def cb(err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            got["error"] = f"{err.name()}: {err.str()}"
        else:
            got["at"] = (msg.partition(), msg.offset())
        done.set()

    producer.produce(topic, value=codec.encode(submission), key=submission.run_id.encode("utf-8"),
                     on_delivery=cb, headers=[("runlog_record", b"RunSubmission")])
    producer.flush(timeout)
    if not done.is_set() or "error" in got:
        raise DeliveryError(topic, submission.run_id, got.get("error", "submission not acknowledged"))
    at: tuple[int, int] = got["at"]
    return at
