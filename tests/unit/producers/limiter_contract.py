"""The contract every limiter keeps (:mod:`runlog.producers.calls._limiter`): the in-memory one in unit
tests, the Redis one against the real server (tests/integration/producers/test_limiter_redis.py)."""

from __future__ import annotations

import uuid

from runlog.producers import RateLimit
from runlog.producers.internal import Limiter


class LimiterContract:
    """Subclasses give :meth:`limiter`; each test uses keys of its own."""

    def limiter(self) -> Limiter:
        raise NotImplementedError

    @staticmethod
    def key() -> str:
        return f"model-{uuid.uuid4().hex[:8]}"

    def test_a_fresh_limit_grants_its_requests_then_says_how_long_to_wait(self) -> None:
        lim, limit = self.limiter(), RateLimit(self.key(), requests=3, per_s=3.0)
        assert [lim.take(limit, 0) for _ in range(3)] == [0, 0, 0]
        wait = lim.take(limit, 0)
        assert 0.3 < wait <= 1.05  # one request a second comes back (less what came back meanwhile)
        assert lim.take(limit, 0) > 0  # a refusal takes nothing, and nothing came back yet

    def test_tokens_are_taken_by_estimate_and_settled_by_what_was_spent(self) -> None:
        lim, limit = self.limiter(), RateLimit(self.key(), tokens=1000, per_s=10.0)
        assert lim.take(limit, 600) == 0
        wait = lim.take(limit, 600)  # 400 left: 200 short, at 100 tokens a second
        assert 1.0 < wait <= 2.1
        lim.settle(limit, 600, 100)  # the call spent far less: 500 back
        assert lim.take(limit, 600) == 0
        lim.settle(limit, 600, 1600)  # this one spent far more: a debt of 1000
        assert lim.take(limit, 100) > 5.0

    def test_a_block_holds_every_taker_of_the_key_and_no_other(self) -> None:
        lim = self.limiter()
        limit, other = RateLimit(self.key(), requests=100), RateLimit(self.key(), requests=100)
        lim.block(limit, 2.0)
        assert 1.0 < lim.take(limit, 0) <= 2.05
        assert lim.take(other, 0) == 0

    def test_an_estimate_above_the_whole_budget_waits_for_a_full_bucket_not_forever(self) -> None:
        lim, limit = self.limiter(), RateLimit(self.key(), tokens=100, per_s=1.0)
        assert lim.take(limit, 500) == 0  # a full bucket grants it (and owes the rest)
        assert lim.take(limit, 10) > 3.0

    def test_a_reservation_takes_now_into_debt_and_keeps_its_place(self) -> None:
        lim, limit = self.limiter(), RateLimit(self.key(), tokens=1000, per_s=10.0)  # 100 tokens a second
        assert lim.reserve(limit, 600) == 0  # it fits: taken, no wait
        first = lim.reserve(limit, 600)  # 200 short: taken all the same, due in about 2 s
        assert 1.0 < first <= 2.1
        second = lim.reserve(limit, 600)  # behind the first: 800 short
        assert second > first + 5.0
        assert lim.take(limit, 100) > second - 0.5  # a take waits behind both reservations
