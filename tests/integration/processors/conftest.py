"""Fixtures of the processors' integration tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.conftest import require
from tests.integration._secure_broker import SecureBroker, available, secure_broker_running


@pytest.fixture(scope="session")
def secure_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBroker]:
    """One real SASL_SSL / mutual-TLS broker (:mod:`tests.integration._secure_broker`) for every test
    of the session that asks for it; skipped (failed under CI) without Java or the jar cache."""
    require(available(), "no Java or no Kafka jar cache (deploy/local/up fetches it)")
    try:
        with secure_broker_running(tmp_path_factory.mktemp("secure-kafka")) as broker:
            yield broker
    except RuntimeError as err:
        if "did not start" not in str(err):
            raise
        pytest.fail(str(err))
