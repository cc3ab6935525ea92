"""People in the loop: resolve an in-doubt effect, cancel a run, retry a failed one.

Operators act through the log (docs/how-to/operate-runs.md): every action takes the
run's lease at a new epoch (``LEASE_ACQUIRED`` with attributes ``operator`` and ``action``),
appends its event with who and why, and lets the lease go, so audits and every fold see it
like any other fact. These functions are the only implementation: ``runlog resolve|cancel|
retry`` and the console call them.

* :func:`resolve_effect` closes an effect intent without a result of a ``BLOCKED`` run:
  ``EFFECT_RESOLVED`` (attributes ``by``, ``reason``, ``decision`` = ``done`` | ``not_done``,
  ``at``). The fold closes the effect: ``done`` as ``DONE`` with the external id, and the call
  gets the result ``{"external_id": ID}`` (reused by the next resume, the tool is not called);
  ``not_done`` as ``FAILED`` (it did not happen) and the call as failed, so the next resume
  runs the tool once. The effects ledger claim moves the same way (``DONE`` with the id, or
  ``FAILED`` so the next attempt may claim the key). When no other effect keeps the run blocked
  the fold makes it ``RUNNING`` again and it is put back in the active set: resumers' sweep
  (or ``runlog resume``) continues it.
* :func:`cancel_run` takes the lease by force (a live writer loses it: its later events carry
  an old epoch and are fenced, and it verifies the lease before every tool call, so it starts
  none) and appends ``RUN_CANCELLED``. ``CANCELLED`` is terminal: the fold keeps it whatever
  comes later, resumers answer ``cancelled`` without a lease, the sweep skips the run.
* :func:`retry_run` resumes a ``FAILED`` run from its last checkpoint at a new epoch (the failed
  stage runs again from its start; recorded results of its calls are reused, the failed call is
  made again). A run whose last failure is terminal (``ErrorInfo.retryable`` false) needs
  ``force``. It also resumes a ``BLOCKED`` run whose cause a person fixed (no in-doubt effect
  left): resumers leave a blocked run alone.

Every refusal raises :class:`OperatorRefused` before anything is appended.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from runlog.producers import Runner, Workflow
from runlog.producers.internal import (
    EffectLedger,
    KafkaRunLog,
    LeaseHeld,
    LedgerEntry,
    RunSession,
    canonical_json,
)
from runlog.projections import EffectEntry, RedisStore, RunState, RunStatus, fold, read_run_tail
from runlog.schemas import EffectStatus, ErrorInfo, EventType, ReplayPolicy, RunlogError, Settings

if TYPE_CHECKING:
    from runlog.processors.resume import App, ResumeOutcome

__all__ = [
    "OperatorRefused",
    "OperatorResult",
    "cancel_run",
    "load_run",
    "resolve_effect",
    "retry_run",
    "take_lease",
    "writer_lease_ms",
]

ATTEMPTS = 5
"""How often an action retries when the run moved between reading it and taking its lease
(its ``LEASE_ACQUIRED`` was not accepted by the fold)."""


class OperatorRefused(RunlogError):
    """An operator action was refused; nothing was appended. The message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class OperatorResult:
    """What an operator action appended: its event's ``seq`` at lease ``epoch``."""

    run_id: str
    action: str
    epoch: int
    seq: int
    detail: str
    status: str = ""
    """The run's status right after the action (``BLOCKED`` while other effects keep it blocked,
    ``RUNNING`` when a resume may continue it, ``CANCELLED``); empty when not known."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def load_run(settings: Settings, run_id: str) -> RunState | None:
    """The run's current state: its projected snapshot (when Redis has one) plus the log's tail
    after it, else a fold of its partition from the start; None when the log has no event of it."""
    store = RedisStore.from_settings(settings)
    try:
        stored = store.checkpoints(run_id, last=1)
        snap = stored[-1].state if stored else store.load_state(run_id)
    finally:
        store.client.close()
    if snap is not None and snap.partition >= 0:
        state, _ = read_run_tail(settings, run_id, snap.partition, snap.offset + 1, snap)
        return state
    state, _ = read_run_tail(settings, run_id, KafkaRunLog(settings).partition_of(run_id), 0, None)
    return state


def writer_lease_ms(settings: Settings, run_id: str) -> int:
    """Milliseconds left on the run's writer lease (0: no lease, its writer is gone)."""
    from runlog.producers.internal import lease_key
    from runlog.schemas.internal import redis_client

    c = redis_client(settings)
    try:
        return max(int(c.pttl(lease_key(settings.redis_prefix, run_id))), 0)
    finally:
        c.close()


def _iso_now() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds")


def _who(by: str | None) -> str:
    who = (by or "").strip()
    if not who:
        raise OperatorRefused("say who is acting: --by is required (recorded on the log)")
    return who


def _why(reason: str | None) -> str:
    why = (reason or "").strip()
    if not why:
        raise OperatorRefused("say why: --reason is required (recorded on the log for audits)")
    return why


def _load(settings: Settings, run_id: str) -> RunState:
    state = load_run(settings, run_id)
    if state is None:
        raise OperatorRefused(f"no run {run_id!r} in Redis or on the events topic")
    return state


@contextmanager
def _runner(settings: Settings) -> Iterator[Runner]:
    r = Runner.from_settings(settings)
    try:
        yield r
    finally:
        r.close()


def take_lease(settings: Settings, runner: Runner, state: RunState, *, by: str, action: str, reason: str,
          force: bool, seal_texts: bool = True) -> tuple[RunSession, RunState] | None:
    """The run's lease at a new epoch with a confirmed ``LEASE_ACQUIRED`` the fold accepted (and
    the state with it), or None when the run moved since ``state`` (the event was not accepted)."""
    wf = state.workflow
    placeholder = Workflow(wf.name if wf else "unknown", wf.version if wf else "0")  # appends only
    session = RunSession.take_over(runner.writer, runner.leases, state.run_id, last_seq=state.last_seq,
                                   workflow=placeholder, input_versions=state.input_versions,
                                   source=runner.source, params={}, epoch=state.epoch, force=force,
                                   last_hash=state.last_hash,
                                   attributes={"operator": by, "action": action, "reason": reason},
                                   subject=state.subject, seal_texts=seal_texts)
    partition = state.partition if state.partition >= 0 else KafkaRunLog(settings).partition_of(state.run_id)
    confirmed, _ = read_run_tail(settings, state.run_id, partition, state.offset + 1, state)
    if confirmed is None or confirmed.epoch != session.epoch or confirmed.last_seq != session.last_seq:
        session.close(release=True)
        return None
    # the tail's read can outlast a heartbeat on a loaded machine (the heartbeat thread waits for a
    # turn): extend the lease now, so the operator's append next is checked against this round trip;
    # one that expired meanwhile is lost, and the append refuses with nothing written
    session.lease.heartbeat()
    return session, confirmed


def _short(key: str) -> str:
    return f"{key[:16]}..."


def _open_effect(state: RunState, key: str, ledger: EffectLedger | None) -> EffectEntry:
    matches = [e for dk, e in state.open_effects.items() if dk.startswith(key)]
    if len(matches) == 1:
        return matches[0]
    if not matches:
        holder = _blocked_elsewhere(state, ledger)
        if holder is not None and not state.open_effects:
            raise OperatorRefused(f"run {state.run_id} has no open effect of its own (none has delivery key "
                                  f"{key!r}): " + holder.hint(state.run_id))
        listed = ", ".join(f"{e.delivery_key} ({e.tool or '?'} {e.call_id or '?'})"
                           for e in sorted(state.open_effects.values(), key=lambda x: x.seq)) or "none"
        raise OperatorRefused(f"run {state.run_id} has no open effect with delivery key {key!r}; "
                              f"its open effects: {listed}"
                              + (f". Also: {holder.hint(state.run_id)}" if holder is not None else ""))
    raise OperatorRefused(f"delivery key prefix {key!r} is ambiguous in run {state.run_id}: it matches "
                          + ", ".join(e.delivery_key for e in matches) + "; give more of the key")


# EffectInDoubt's reason (producers/calls/_call_ledger.py): "TOOL (NEVER) for TARGET: delivery key DK is in
# doubt in run RUN (call CALL, STATUS); ..."
_IN_DOUBT_ELSEWHERE = re.compile(r"(?:(?P<tool>\S+) \(NEVER\) for \S+: )?delivery key (?P<dk>[0-9a-f]{64}) "
                                 r"is in doubt in run (?P<run>[^\s,;()]+)(?: \(call (?P<call>[^\s,;()]+))?")


@dataclasses.dataclass(frozen=True)
class _Holder:
    """The effect, open in another run, that a run is blocked by (a branch by its parent's)."""

    run_id: str
    delivery_key: str
    tool: str | None
    call_id: str | None
    entry: LedgerEntry | None
    """The effects ledger's entry for the key now (None: not known to it)."""

    @property
    def in_doubt(self) -> bool:
        """The ledger still records the effect open (intent without result) in the run holding it."""
        return self.entry is not None and not self.decided

    @property
    def decided(self) -> bool:
        """The ledger records the effect done, reconciled or not done (resolved) since the run blocked."""
        return self.entry is not None and self.entry.status in (
            EffectStatus.DONE, EffectStatus.RECONCILED, EffectStatus.FAILED)

    def hint(self, run_id: str) -> str:
        what = f"{self.tool or 'an effect'}" + (f" (call {self.call_id})" if self.call_id else "")
        where = f"{what} of run {self.run_id}, delivery key {self.delivery_key}"
        if self.decided:
            assert self.entry is not None
            how = ("not done" if self.entry.status is EffectStatus.FAILED
                   else f"{self.entry.status.value} with external id {self.entry.external_id}")
            return (f"it was blocked by {where}, which is decided now ({how}): `runlog retry {run_id}` "
                    "continues this run")
        return (f"it is blocked by {where}, in doubt there. Resolve it in run {self.run_id}: `runlog resolve "
                f"{self.run_id} --effect {self.delivery_key[:16]} --done --external-id ID` (or --not-done), "
                f"with --by and --reason; then `runlog retry {run_id}` continues this run")


def _blocked_elsewhere(state: RunState, ledger: EffectLedger | None) -> _Holder | None:
    """For a run blocked by an effect open in another run (its parent, for a branch): that run and effect,
    from the block's reason, with the effects ledger's entry for the key."""
    err = state.last_error
    if state.status is not RunStatus.BLOCKED or err is None or err.kind != "EffectInDoubt":
        return None
    found = _IN_DOUBT_ELSEWHERE.search(err.message)
    if found is None or found["run"] == state.run_id:
        return None
    dk = found["dk"]
    entry = ledger.lookup(dk) if ledger is not None else None
    if entry is not None and entry.run_id == state.run_id:
        return None  # the run holds the key itself now
    if entry is None:
        return _Holder(found["run"], dk, found["tool"], found["call"], None)
    return _Holder(entry.run_id, dk, entry.tool or found["tool"], entry.call_id or found["call"], entry)


def resolve_effect(settings: Settings, run_id: str, key: str, *, done: bool, external_id: str | None,
                   by: str, reason: str) -> OperatorResult:
    """Decide an in-doubt effect of a ``BLOCKED`` run: it happened (``done``, with the external
    system's ``external_id``) or it did not (the next resume runs the tool once). A ``CANCELLED``
    run's in-doubt effect is resolved the same way (the run stays cancelled): until then its delivery
    key is in doubt for every other run that asks for it.

    Args:
        key: the effect's delivery key, or a prefix matching exactly one open effect of the run.

    Raises:
        OperatorRefused: empty ``by`` or ``reason``; ``done`` without ``external_id`` (or
            ``external_id`` without ``done``); no such run; the run is not ``BLOCKED`` or
            ``CANCELLED``; ``key``
            matches no open effect or several; the effects ledger records the key done with
            another external id (or done when ``done`` is false); another writer holds the lease.
    """
    who, why = _who(by), _why(reason)
    key = (key or "").strip()
    ext = (external_id or "").strip() or None
    if not key:
        raise OperatorRefused("name the effect: --effect DELIVERY_KEY (or an unambiguous prefix)")
    if done and ext is None:
        raise OperatorRefused("--done needs --external-id: the id the external system gave the effect")
    if not done and ext is not None:
        raise OperatorRefused("--external-id goes with --done; --not-done says the effect did not happen")
    decision = "done" if done else "not_done"
    with _runner(settings) as runner:
        for _ in range(ATTEMPTS):
            state = _load(settings, run_id)
            if state.status not in (RunStatus.BLOCKED, RunStatus.CANCELLED):
                raise OperatorRefused(f"run {run_id} is {state.status.value}, not BLOCKED: only a blocked "
                                      "(or cancelled) run's in-doubt effects are resolved")
            eff = _open_effect(state, key, runner.ledger)
            dk = eff.delivery_key
            known = runner.ledger.lookup(dk) if runner.ledger is not None else None
            if known is not None and known.done:
                if not done:
                    raise OperatorRefused(
                        f"the effects ledger records delivery key {dk} done with external id "
                        f"{known.external_id} (run {known.run_id}): it happened; resolve it --done "
                        f"--external-id {known.external_id}")
                if known.external_id != ext:
                    raise OperatorRefused(
                        f"the effects ledger records delivery key {dk} done with external id "
                        f"{known.external_id} (run {known.run_id}), not {ext}")
            try:
                taken = take_lease(settings, runner, state, by=who, action="resolve", reason=why, force=False)
            except LeaseHeld as err:
                raise OperatorRefused(f"run {run_id} is being written right now ({err}); try again "
                                      "when it is blocked") from err
            if taken is None:
                continue  # the run moved between reading it and taking the lease: look again
            session, confirmed = taken
            try:
                ref = runner.store.for_subject(state.subject).put(
                    canonical_json({"external_id": ext}), "application/json") if done else None
                res = session.append(
                    EventType.EFFECT_RESOLVED, confirm=True, stage=eff.stage, tool=eff.tool,
                    call_id=eff.call_id, delivery_key=dk, target=eff.target, replay_policy=eff.replay_policy,
                    request_hash=eff.request_hash, external_id=ext, payload_ref=ref,
                    attributes={"by": who, "reason": why, "decision": decision, "at": _iso_now()})
                if runner.ledger is not None:
                    runner.ledger.close(dk, run_id, eff.call_id,
                                        EffectStatus.DONE if done else EffectStatus.FAILED, ext)
                after, _ = fold(confirmed, res.event, content_hash=res.hash)
                if after.status is RunStatus.RUNNING and runner.active is not None:
                    runner.active.add(run_id, confirmed.workflow_name)  # the sweep continues it
                session.flush()
            finally:
                session.close(release=True)
            still = [e.delivery_key for e in after.open_intents]
            if after.status is RunStatus.CANCELLED:
                then = "the run stays CANCELLED; other runs may now use the delivery key"
            elif after.status is RunStatus.BLOCKED:
                then = f"the run stays BLOCKED on {len(still)} other open effect(s)"
            else:
                then = "a resume continues the run"
            detail = (f"effect {_short(dk)} ({eff.tool} {eff.call_id}) resolved {decision}"
                      + (f" with external id {ext}" if ext else "") + f" by {who}; " + then)
            return OperatorResult(run_id, "resolve", session.epoch, res.event.seq, detail, after.status.value)
    raise OperatorRefused(f"run {run_id} kept moving while resolving (tried {ATTEMPTS} times); try again")


def cancel_run(settings: Settings, run_id: str, *, by: str, reason: str) -> OperatorResult:
    """Cancel a run: take its lease by force at a new epoch and append ``RUN_CANCELLED``.

    A live writer is fenced: the lease it held is gone, so it starts no further tool call
    (``LeaseLost``) and whatever it still appends carries the old epoch, which the fold rejects.
    Effects already done stay recorded; resumers and the sweep leave the run alone from now on.

    Raises:
        OperatorRefused: empty ``by`` or ``reason``; no such run; the run is ``COMPLETED`` or
            already ``CANCELLED``.
    """
    who, why = _who(by), _why(reason)
    with _runner(settings) as runner:
        for _ in range(ATTEMPTS):
            state = _load(settings, run_id)
            if state.status in (RunStatus.COMPLETED, RunStatus.CANCELLED):
                raise OperatorRefused(f"run {run_id} is {state.status.value}: there is nothing to cancel")
            taken = take_lease(settings, runner, state, by=who, action="cancel", reason=why, force=True)
            if taken is None:
                continue  # a live writer appended meanwhile: read its events and take over again
            session, _ = taken
            try:
                res = session.append(EventType.RUN_CANCELLED, confirm=True,
                                     error=ErrorInfo("RunCancelled", f"cancelled by {who}: {why}", False),
                                     attributes={"by": who, "reason": why, "at": _iso_now(),
                                                 "status_before": state.status.value})
            finally:
                session.close(release=True)
            if runner.active is not None:
                runner.active.cancel(run_id)
            if state.parent_run_id is not None and state.parent_call:  # a child: its waiting parent learns it
                with contextlib.suppress(RunlogError):
                    runner.writer.request_resume(state.parent_run_id, f"child {run_id} cancelled")
            cancelled = _cancel_children(settings, state, by=who, reason=why)
            more = f"; {len(cancelled)} child run(s) cancelled with it" if cancelled else ""
            return OperatorResult(run_id, "cancel", session.epoch, res.event.seq,
                                  f"run {run_id} cancelled by {who} (was {state.status.value}){more}",
                                  RunStatus.CANCELLED.value)
    raise OperatorRefused(f"run {run_id} kept moving while cancelling (tried {ATTEMPTS} times); try again")


def _cancel_children(settings: Settings, state: RunState, *, by: str, reason: str) -> list[str]:
    """The policy for a cancelled parent: every child run it started (``ctx.start_child``) that has not
    ended is cancelled too, and theirs in turn; nobody waits for them. Their ids."""
    done: list[str] = []
    for child in state.children:
        try:
            if _load(settings, child).status not in (RunStatus.PENDING, RunStatus.RUNNING, RunStatus.WAITING):
                continue  # it ended (a failed or blocked child keeps its own outcome)
            cancel_run(settings, child, by=by, reason=f"its parent {state.run_id} was cancelled: {reason}")
        except OperatorRefused:
            continue  # ended already (completed, cancelled), or not on the log
        done.append(child)
    return done


def retry_run(settings: Settings, app: App, run_id: str, *, by: str, force: bool = False,
              reason: str = "") -> ResumeOutcome:
    """Resume a ``FAILED`` run from its last checkpoint at a new epoch (in this process); or a
    ``BLOCKED`` one whose cause a person fixed (artifacts restored, the run's workflow deployed
    again): a plain resume leaves a blocked run alone, this is the person's decision on the log.

    The failed stage runs again from its start: recorded results of the calls before the
    failure are reused, the failed call is made again. ``LEASE_ACQUIRED`` carries
    ``operator`` = ``by``, ``action`` = ``retry`` (``retry --force`` when forced) and ``reason``.

    Raises:
        OperatorRefused: empty ``by``; no such run; the run is not ``FAILED`` or ``BLOCKED``; a
            failed run's last failure is terminal (not retryable) and ``force`` is false; a blocked
            run has in-doubt effects (``runlog resolve`` decides them), or is blocked by an effect the
            effects ledger still records in doubt in another run (a branch by its parent's: the
            message names that run and key; resolve it there first).
    """
    from runlog.processors.resume import Resumer, UnknownRun

    who = _who(by)
    with Resumer(settings, app) as r:
        try:
            state, _ = r.load(run_id)
        except UnknownRun as err:
            raise OperatorRefused(str(err)) from err
        if state.status not in (RunStatus.FAILED, RunStatus.BLOCKED):
            raise OperatorRefused(f"run {run_id} is {state.status.value}, not FAILED or BLOCKED: only a "
                                  "failed or blocked run is retried (a crashed one is resumed: runlog "
                                  "resume)")
        doubt = [e.delivery_key for e in state.open_effects.values()
                 if e.replay_policy in (None, ReplayPolicy.NEVER)]
        if state.status is RunStatus.BLOCKED and doubt:
            raise OperatorRefused(f"run {run_id} is blocked on {len(doubt)} in-doubt effect(s) "
                                  f"({', '.join(_short(k) for k in doubt)}): resolve them (runlog resolve)")
        holder = _blocked_elsewhere(state, r.runner.ledger)
        if holder is not None and holder.in_doubt:  # a retry would only block again
            raise OperatorRefused(f"run {run_id} would block again: " + holder.hint(run_id))
        last = state.last_error
        if state.status is RunStatus.FAILED and not force and (last is None or not last.retryable):
            what = "an unknown error" if last is None else f"{last.kind}: {last.message[:200]}"
            raise OperatorRefused(f"run {run_id} failed with a terminal error ({what}); a retry may fail "
                                  "the same way: pass --force to retry it anyway")
        action = "retry --force" if force else "retry"
        return r.resume(run_id, retry=True, attributes={"operator": who, "action": action, "reason": reason})
