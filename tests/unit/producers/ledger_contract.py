"""One contract for every EffectLedger adapter: subclass it once per backend, provide ``ledger``.

Every case runs on both faces of the port (``[sync]``: open/close; ``[async]``: aopen /
aclose_effect on an event loop, see :mod:`tests.unit.producers.faces`): the async face
behaves exactly like the sync one. A subclass whose ledger holds asyncio resources closes
them in :meth:`aclean`.
"""

from __future__ import annotations

from typing import cast

import pytest

from runlog.producers.calls._ledger import EffectLedger, LedgerEntry
from runlog.schemas import EffectStatus

from .faces import FACES, Face

DK = "d" * 64


def entry(run: str, call: str = "s/t/0", idem: str | None = None) -> LedgerEntry:
    return LedgerEntry(DK, run, call, EffectStatus.INTENT, None, idem, "t")


class LedgerContract:
    ledger: EffectLedger

    async def aclean(self) -> None:
        """Close what the ledger opened on the async case's loop (called on it, at the end)."""

    @pytest.fixture(params=FACES, ids=repr)
    def face(self, request: pytest.FixtureRequest) -> Face:
        return cast(Face, request.param)

    def test_the_first_call_owns_a_new_key(self, face: Face) -> None:
        async def case() -> None:
            assert self.ledger.lookup(DK) is None
            assert await face.open(self.ledger, entry("run-a")) is None
            got = self.ledger.lookup(DK)
            assert got is not None and (got.run_id, got.status) == ("run-a", EffectStatus.INTENT)

        face.run(case, self.aclean)

    def test_the_same_call_again_still_owns_it(self, face: Face) -> None:
        async def case() -> None:
            assert await face.open(self.ledger, entry("run-a")) is None
            assert await face.open(self.ledger, entry("run-a")) is None

        face.run(case, self.aclean)

    def test_another_run_sees_an_open_claim_in_doubt_with_its_idempotency_key(self, face: Face) -> None:
        async def case() -> None:
            assert await face.open(self.ledger, entry("run-a", idem="k-a")) is None
            other = await face.open(self.ledger, entry("run-b"))
            assert other is not None and not other.done
            assert (other.run_id, other.call_id, other.idempotency_key) == ("run-a", "s/t/0", "k-a")
            got = self.ledger.lookup(DK)
            assert got is not None and got.run_id == "run-a"  # the open claim is not taken over

        face.run(case, self.aclean)

    def test_a_done_effect_is_done_for_every_run_and_the_same_call(self, face: Face) -> None:
        async def case() -> None:
            assert await face.open(self.ledger, entry("run-a")) is None
            await face.close(self.ledger, DK, "run-a", "s/t/0", EffectStatus.DONE, "ext-1")
            for asker in (entry("run-b"), entry("run-a"), entry("run-a", "s/t/9")):
                other = await face.open(self.ledger, asker)
                assert other is not None and other.done and other.external_id == "ext-1"

        face.run(case, self.aclean)

    def test_a_failed_attempt_frees_the_key(self, face: Face) -> None:
        async def case() -> None:
            assert await face.open(self.ledger, entry("run-a")) is None
            await face.close(self.ledger, DK, "run-a", "s/t/0", EffectStatus.FAILED)
            assert await face.open(self.ledger, entry("run-b")) is None
            got = self.ledger.lookup(DK)
            assert got is not None and got.run_id == "run-b"

        face.run(case, self.aclean)

    def test_only_the_holder_records_a_failure_and_nothing_undoes_done(self, face: Face) -> None:
        async def case() -> None:
            assert await face.open(self.ledger, entry("run-a")) is None
            await face.close(self.ledger, DK, "run-b", "s/t/0", EffectStatus.FAILED)  # not the holder
            got = self.ledger.lookup(DK)
            assert got is not None and got.status is EffectStatus.INTENT
            await face.close(self.ledger, DK, "run-b", "s/t/0", EffectStatus.RECONCILED, "ext-9")  # a fact
            await face.close(self.ledger, DK, "run-a", "s/t/0", EffectStatus.FAILED)
            await face.close(self.ledger, DK, "run-a", "s/t/0", EffectStatus.DONE, "ext-other")
            got = self.ledger.lookup(DK)
            assert got is not None and got.done and got.external_id == "ext-9"

        face.run(case, self.aclean)

    def test_done_without_a_claim_is_recorded(self, face: Face) -> None:
        async def case() -> None:
            await face.close(self.ledger, DK, "run-a", "s/t/0", EffectStatus.DONE, "ext-1")
            got = self.ledger.lookup(DK)
            assert got is not None and got.done and got.external_id == "ext-1"

        face.run(case, self.aclean)
