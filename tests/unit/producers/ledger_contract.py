"""One contract for every EffectLedger adapter: subclass it once per backend, provide ``ledger``."""

from __future__ import annotations

from producers._ledger import EffectLedger, LedgerEntry
from schemas import EffectStatus

DK = "d" * 64


def entry(run: str, call: str = "s/t/0", idem: str | None = None) -> LedgerEntry:
    return LedgerEntry(DK, run, call, EffectStatus.INTENT, None, idem, "t")


class LedgerContract:
    ledger: EffectLedger

    def test_the_first_call_owns_a_new_key(self) -> None:
        assert self.ledger.lookup(DK) is None
        assert self.ledger.open(entry("run-a")) is None
        got = self.ledger.lookup(DK)
        assert got is not None and (got.run_id, got.status) == ("run-a", EffectStatus.INTENT)

    def test_the_same_call_again_still_owns_it(self) -> None:
        assert self.ledger.open(entry("run-a")) is None
        assert self.ledger.open(entry("run-a")) is None

    def test_another_run_sees_an_open_claim_in_doubt_with_its_idempotency_key(self) -> None:
        assert self.ledger.open(entry("run-a", idem="k-a")) is None
        other = self.ledger.open(entry("run-b"))
        assert other is not None and not other.done
        assert (other.run_id, other.call_id, other.idempotency_key) == ("run-a", "s/t/0", "k-a")
        got = self.ledger.lookup(DK)
        assert got is not None and got.run_id == "run-a"  # the open claim is not taken over

    def test_a_done_effect_is_done_for_every_run_and_the_same_call(self) -> None:
        assert self.ledger.open(entry("run-a")) is None
        self.ledger.close(DK, "run-a", "s/t/0", EffectStatus.DONE, "ext-1")
        for asker in (entry("run-b"), entry("run-a"), entry("run-a", "s/t/9")):
            other = self.ledger.open(asker)
            assert other is not None and other.done and other.external_id == "ext-1"

    def test_a_failed_attempt_frees_the_key(self) -> None:
        assert self.ledger.open(entry("run-a")) is None
        self.ledger.close(DK, "run-a", "s/t/0", EffectStatus.FAILED)
        assert self.ledger.open(entry("run-b")) is None
        got = self.ledger.lookup(DK)
        assert got is not None and got.run_id == "run-b"

    def test_only_the_holder_records_a_failure_and_nothing_undoes_done(self) -> None:
        assert self.ledger.open(entry("run-a")) is None
        self.ledger.close(DK, "run-b", "s/t/0", EffectStatus.FAILED)  # not the holder: ignored
        got = self.ledger.lookup(DK)
        assert got is not None and got.status is EffectStatus.INTENT
        self.ledger.close(DK, "run-b", "s/t/0", EffectStatus.RECONCILED, "ext-9")  # done is a fact
        self.ledger.close(DK, "run-a", "s/t/0", EffectStatus.FAILED)
        self.ledger.close(DK, "run-a", "s/t/0", EffectStatus.DONE, "ext-other")
        got = self.ledger.lookup(DK)
        assert got is not None and got.done and got.external_id == "ext-9"

    def test_done_without_a_claim_is_recorded(self) -> None:
        self.ledger.close(DK, "run-a", "s/t/0", EffectStatus.DONE, "ext-1")
        got = self.ledger.lookup(DK)
        assert got is not None and got.done and got.external_id == "ext-1"
