"""The in-memory effects ledger passes the shared contract."""

from __future__ import annotations

import pytest

from runlog.testing import InMemoryEffectLedger

from .ledger_contract import LedgerContract


class TestInMemoryLedger(LedgerContract):
    @pytest.fixture(autouse=True)
    def _ledger(self) -> None:
        self.ledger = InMemoryEffectLedger()
