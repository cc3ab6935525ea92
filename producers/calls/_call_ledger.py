"""The effects ledger's steps of a tool call (a part of the stage context,
:class:`runlog.producers.calls._call_steps._ContextCore`): before an effect tool executes, its delivery key is
opened in the ledger shared by all runs. Done in another run: the tool is not called and that run's
external id is this call's result (``EFFECT_RECONCILED`` with ``source=ledger``). Open in another run:
in doubt, handled by the tool's policy (``RECONCILE_FIRST`` asks the external system, ``NEVER`` blocks
the run for a person). A claim no replica acknowledged is released and the call fails before the
effect runs (:class:`~runlog.projections._replicas.ReplicasBehind`)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from typing import Any

from runlog.producers.base._protocol import Invoke, Steps, io
from runlog.producers.calls._calls import _external_id
from runlog.producers.calls._keys import canonical_json
from runlog.producers.calls._ledger import EffectLedger, LedgerEntry, LedgerUnavailable
from runlog.producers.calls._stage_artifacts import StageArtifacts
from runlog.producers.define._tools import CallInfo, Tool
from runlog.producers.log._session import RunSession
from runlog.projections.internal import ReplicasBehind
from runlog.schemas import EffectStatus, EventType, ReplayPolicy
from runlog.schemas.errors import EffectInDoubt, RunlogError

__all__ = ["EffectClaims"]


class EffectClaims:
    """The ledger's part of a stage context: claims of the stage's effects in the ledger shared by all runs.

    Args:
        session: the run's session (what is appended).
        ledger: the effects ledger (None: none consulted, nothing claimed).
        artifacts: where a reconciled record is stored.
        fail: records the stage's failure (an effect in doubt fails it).
    """

    def __init__(self, session: RunSession, ledger: EffectLedger | None, artifacts: StageArtifacts,
                 fail: Callable[[BaseException], None]) -> None:
        self.session = session
        self.ledger = ledger
        self._artifacts = artifacts
        self._fail = fail

    def close(self, info: CallInfo, status: EffectStatus, external_id: str | None = None) -> Steps[None]:
        """Mark the call's claim ``status`` (nothing without a ledger)."""
        if self.ledger is not None and info.delivery_key is not None:
            yield from io(self.ledger.close, self.ledger.aclose_effect, info.delivery_key, info.run_id,
                          info.call_id, status, external_id)

    def open(self, tool: Tool, info: CallInfo) -> Steps[LedgerEntry | None]:
        if self.ledger is None or info.delivery_key is None:
            return None
        entry = LedgerEntry(info.delivery_key, info.run_id, info.call_id, EffectStatus.INTENT, None,
                            info.idempotency_key, tool.name)
        try:
            found: LedgerEntry | None = yield from io(self.ledger.open, self.ledger.aopen, entry)
        except (ReplicasBehind, LedgerUnavailable) as err:
            if not isinstance(err, ReplicasBehind) and not isinstance(err.__cause__, ReplicasBehind):
                raise  # Redis unreachable: nothing known of the claim; the run is let go of
            # The claim is on the primary, not known to be on a replica: the effect is not executed.
            # Release it (FAILED: did not happen), so another run is not left in doubt by a claim
            # nothing acted on; if a failover takes this release back, the claim reads in doubt
            # again, which is the safe side.
            with contextlib.suppress(RunlogError):
                yield from io(self.ledger.close, self.ledger.aclose_effect, info.delivery_key, info.run_id,
                              info.call_id, EffectStatus.FAILED, None)
            raise
        return found

    def _settle(self, tool: Tool, info: CallInfo, record: Mapping[str, Any], common: dict[str, Any],
                attrs: dict[str, str]) -> Steps[dict[str, Any]]:
        """Record an effect found done in the world: ``EFFECT_RECONCILED`` then ``TOOL_RESULT``."""
        s = self.session
        assert info.delivery_key is not None
        out = dict(record)
        ref = yield from self._artifacts.put(canonical_json(out))
        yield from s.appending(EventType.EFFECT_RECONCILED, confirm=True, delivery_key=info.delivery_key,
                               target=tool.target, external_id=_external_id(out), payload_ref=ref,
                               attributes=attrs, **common)
        yield from s.appending(EventType.TOOL_RESULT, payload_ref=ref, external_id=_external_id(out),
                               attributes={"source": attrs.get("source", "reconciled")}, **common)
        return out

    def reuse(self, tool: Tool, info: CallInfo, args: Mapping[str, Any], other: LedgerEntry,
                      common: dict[str, Any]) -> Steps[dict[str, Any]]:
        """Done in another run: no call; that run's external id is this call's result."""
        record: Mapping[str, Any] | None = None
        if tool.reconcile is not None and info.delivery_key is not None:
            record = yield from Invoke(tool.reconcile, (info.delivery_key, args))
        if record is None or _external_id(record) != other.external_id:
            record = {"external_id": other.external_id}
        attrs = {"source": "ledger", "from_run": other.run_id, "from_call": other.call_id or "",
                 "ledger": other.source}
        return (yield from self._settle(tool, info, record, common, attrs))

    def in_doubt(self, tool: Tool, info: CallInfo, args: Mapping[str, Any], other: LedgerEntry,
                  common: dict[str, Any]) -> Steps[dict[str, Any] | None]:
        """Open in another run. Returns the record when reconcile found the effect done; None to
        execute; raises EffectInDoubt when the policy leaves it to a person."""
        dk = info.delivery_key
        assert dk is not None
        if tool.policy is ReplayPolicy.RECONCILE_FIRST and tool.reconcile is not None:
            record = yield from Invoke(tool.reconcile, (dk, args))
            if record is not None and _external_id(record) is not None:
                if self.ledger is not None:
                    yield from io(self.ledger.close, self.ledger.aclose_effect, dk, info.run_id, info.call_id,
                                  EffectStatus.RECONCILED, _external_id(record))
                attrs = {"source": "ledger", "from_run": other.run_id, "from_call": other.call_id or "",
                         "ledger": other.source, "reconciled": "true"}
                return (yield from self._settle(tool, info, record, common, attrs))
            return None
        if tool.policy is ReplayPolicy.NEVER:
            err = EffectInDoubt(
                info.run_id, dk, other.run_id,
                f"{tool.name} (NEVER) for {tool.target}: delivery key {dk} is in doubt in run "
                f"{other.run_id} (call {other.call_id}, {other.status.value}); a person must check "
                "whether it happened before this run may go on")
            self._fail(err)
            raise err
        return None
