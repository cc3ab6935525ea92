"""Free text on events with encryption on: a session seals error messages and operators' reasons under
the run's subject's key; machine-made messages and other attributes stay readable; an erased subject's
text is written as ``[erased]``; the erase's own record can be kept readable."""

from __future__ import annotations

import uuid
from pathlib import Path

from runlog.producers.define._inputs import DictInputSource, PinnedInputs
from runlog.producers.define._workflow import Workflow
from runlog.producers.internal import (
    ERASED_TEXT,
    InMemoryEventLog,
    InMemoryLeaseManager,
    RunSession,
    TextSealer,
    store_from_settings,
    subject_keys,
)
from runlog.schemas import ErrorInfo, EventType, RuleResult, RunEvent, Settings


def _log(tmp_path: Path, encryption: bool = True) -> InMemoryEventLog:
    return InMemoryEventLog(Settings.from_env({}).with_(encryption=encryption, keyring=str(tmp_path / "kr"),
                                                         artifact_root=str(tmp_path / "a")))


def _append(log: InMemoryEventLog, subject: str | None, *, seal: bool = True) -> list[RunEvent]:
    run = f"run-{uuid.uuid4().hex}"
    s = RunSession(log, InMemoryLeaseManager().acquire(run), run_id=run, next_seq=1,
                   workflow=Workflow("w", "1"), inputs=PinnedInputs(DictInputSource({}), {}), params={})
    s.subject, s.seal_texts = subject, seal
    s.append(EventType.FAILED, stage="pay", error=ErrorInfo("ValueError", "card 4242 of alice declined"))
    doubt = ErrorInfo("EffectInDoubt", "delivery key " + "a" * 64 + " in doubt")
    s.append(EventType.RUN_BLOCKED, error=doubt,
             attributes={"reason": "alice asked", "by": "ops", "signal": "budget"})
    return log.events(run)


def test_a_session_seals_error_messages_and_reasons_for_its_subject(tmp_path: Path) -> None:
    log = _log(tmp_path)
    failed, blocked = _append(log, "cust-alice")
    assert failed.error is not None and failed.error.message.startswith("rlenc1:")
    assert "4242" not in failed.error.message and failed.error.kind == "ValueError"
    assert blocked.error is not None and blocked.error.message.startswith("delivery key aaaa")  # machine-made
    assert blocked.attributes["reason"].startswith("rlenc1:") and blocked.attributes["by"] == "ops"
    store = store_from_settings(log.settings)
    assert store.open_text(failed.error.message) == "card 4242 of alice declined"
    assert store.open_text(blocked.attributes["reason"]) == "alice asked"
    # under the subject's own key: another subject's envelope differs; erased, it reads [erased]
    other = _append(log, "cust-bob")[0]
    assert other.error is not None and other.error.message != failed.error.message
    subject_keys(log.settings).erase("cust-alice", by="dpo", reason="request")
    assert store.open_text(failed.error.message) == ERASED_TEXT
    assert store.open_text(other.error.message) == "card 4242 of alice declined"
    # written after the erasure: [erased], never in clear; unless the session keeps its texts (the erase)
    later = _append(log, "cust-alice")
    assert later[0].error is not None and later[0].error.message == ERASED_TEXT
    assert later[1].attributes["reason"] == ERASED_TEXT
    kept = _append(log, "cust-alice", seal=False)
    assert kept[1].attributes["reason"] == "alice asked"


def test_encryption_off_leaves_texts_as_they_are(tmp_path: Path) -> None:
    failed, blocked = _append(_log(tmp_path, encryption=False), "cust-alice")
    assert failed.error is not None and failed.error.message == "card 4242 of alice declined"
    assert blocked.attributes["reason"] == "alice asked"


def test_a_sealer_without_the_key_leaves_the_sealed_text(tmp_path: Path) -> None:
    log = _log(tmp_path)
    sealed = TextSealer(subject_keys(log.settings), "default").seal("cust-x", "hello")
    assert sealed.startswith("rlenc1:")
    elsewhere = TextSealer(subject_keys(log.settings.with_(keyring=str(tmp_path / "other"))), "default")
    assert elsewhere.open(sealed) == sealed
    assert TextSealer(subject_keys(log.settings), "default").open(sealed) == "hello"


def test_runlog_show_opens_sealed_texts_with_the_keyring_and_masks_them_without(tmp_path: Path) -> None:
    from runlog.processors.inspect import redact_text, render_timeline
    from runlog.processors.inspect.log import LoggedEvent
    from runlog.projections import fold

    log = _log(tmp_path)
    history, state = [], None
    for i, e in enumerate(_append(log, "cust-alice")):
        state, outcome = fold(state, e)
        history.append(LoggedEvent(i, e, outcome, state))
    masked = render_timeline(history)
    assert "[sealed]" in masked and "rlenc1:" not in masked and "4242" not in masked
    opened = render_timeline(history, store_from_settings(log.settings).open_text)
    assert "card 4242 of alice declined" in opened and "reason=alice asked" in opened
    assert redact_text("why: rlenc1:AAEC+/== and more") == "why: [sealed] and more"


def test_verification_details_are_sealed_and_their_rules_stay_readable(tmp_path: Path) -> None:
    log = _log(tmp_path)
    run = f"run-{uuid.uuid4().hex}"
    s = RunSession(log, InMemoryLeaseManager().acquire(run), run_id=run, next_seq=1,
                   workflow=Workflow("w", "1"), inputs=PinnedInputs(DictInputSource({}), {}), params={})
    s.subject = "cust-alice"
    rules = (RuleResult("total_matches", False, "expected 4242 in the answer of alice"),
             RuleResult("non_empty", True, None))
    s.append(EventType.VERIFIED, stage="pay", verification=rules)
    [verified] = log.events(run)
    failed, passed = verified.verification
    assert (failed.rule, failed.passed) == ("total_matches", False)
    assert (passed.rule, passed.passed) == ("non_empty", True)
    assert failed.detail is not None and failed.detail.startswith("rlenc1:") and "4242" not in failed.detail
    assert passed.detail is None
    opened = store_from_settings(log.settings).open_text(failed.detail)
    assert opened == "expected 4242 in the answer of alice"
