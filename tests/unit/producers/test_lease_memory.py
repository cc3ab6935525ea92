"""The in-memory lease passes the shared contract."""

from __future__ import annotations

import pytest

from runlog.testing import InMemoryLeaseManager, InMemoryLeaseTable

from .lease_contract import LeaseContract


class TestInMemoryLease(LeaseContract):
    @pytest.fixture(autouse=True)
    def _table(self) -> None:
        self.table = InMemoryLeaseTable()

    def manager(self, holder: str) -> InMemoryLeaseManager:
        return InMemoryLeaseManager(self.table, holder=holder)

    def expire(self, run_id: str) -> None:
        self.table.expire(run_id)
