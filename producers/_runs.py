"""Run idempotency keys in Redis: one key names at most one run, ever.

``{prefix}:runs:by_idempotency_key:<lp_sha256(key)>`` holds canonical JSON
``{"run_id", "params_hash", "workflow"}``, written with SET NX (no TTL). The
same key with the same workflow and params resolves to the existing run; with
anything else it is refused with :class:`~schemas.errors.RunConflict`.
"""

from __future__ import annotations

import json

import redis

from producers._keys import canonical_json, lp_sha256
from schemas.errors import RunConflict

__all__ = ["RunKeys"]

_UNCLAIM = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""


class RunKeys:
    """Claims run idempotency keys."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self._r = client
        self.prefix = prefix
        self._unclaim = client.register_script(_UNCLAIM)

    def key(self, idempotency_key: str) -> str:
        return f"{self.prefix}:runs:by_idempotency_key:{lp_sha256(idempotency_key)}"

    @staticmethod
    def _value(run_id: str, params_hash: str, workflow: str) -> bytes:
        return canonical_json({"run_id": run_id, "params_hash": params_hash, "workflow": workflow})

    def claim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> str | None:
        """None when ``run_id`` now owns the key; the existing run id when the same
        request was made before.

        Raises:
            RunConflict: the key names a run of another workflow or other params.
        """
        k = self.key(idempotency_key)
        if self._r.set(k, self._value(run_id, params_hash, workflow), nx=True):
            return None
        raw = self._r.get(k)
        if raw is None:  # unclaimed in between by a failed start: try once more
            return self.claim(idempotency_key, run_id, params_hash, workflow)
        found = json.loads(raw)
        if found["workflow"] != workflow:
            raise RunConflict(idempotency_key, found["run_id"],
                              f"it was started for workflow {found['workflow']}, not {workflow}")
        if found["params_hash"] != params_hash:
            raise RunConflict(idempotency_key, found["run_id"],
                              f"it was started with params sha256 {found['params_hash']}, these hash to "
                              f"{params_hash}; use a new key for new parameters")
        return str(found["run_id"])

    def unclaim(self, idempotency_key: str, run_id: str, params_hash: str, workflow: str) -> None:
        """Drop a claim whose run never got its ``RUN_STARTED`` (compare-and-delete)."""
        self._unclaim(keys=[self.key(idempotency_key)], args=[self._value(run_id, params_hash, workflow)])
