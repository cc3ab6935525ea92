"""The store contract against the in-memory adapter (the one :mod:`runlog.testing` gives users)."""

from __future__ import annotations

import pytest

from runlog.testing import MemoryStore

from .store_contract import StoreContract


class TestMemoryStore(StoreContract):
    @pytest.fixture(autouse=True)
    def _store(self) -> None:
        self.store = MemoryStore()
