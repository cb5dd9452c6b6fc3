"""RateLimiter: a minute's worth at once, refilled evenly, per key; a request larger than a minute's worth passes
from a full bucket and the bucket owes the rest."""

from __future__ import annotations

import pytest

from app.api.rates import RateLimiter


def test_bucket_grants_a_minutes_worth_then_refills_evenly() -> None:
    limiter = RateLimiter(per_minute=60)
    assert all(limiter.take("a", 1, now=0.0) == 0.0 for _ in range(60))
    assert limiter.take("a", 1, now=0.0) == pytest.approx(1.0)  # one unit a second
    assert limiter.take("b", 1, now=0.0) == 0.0  # another key has its own bucket
    assert limiter.take("a", 1, now=1.0) == 0.0
    assert limiter.take("a", 5, now=3.0) == pytest.approx(3.0)  # 2 refilled, 5 wanted


def test_a_request_beyond_the_bucket_passes_when_full_and_leaves_a_debt() -> None:
    limiter = RateLimiter(per_minute=100)
    assert limiter.take("a", 250, now=0.0) == 0.0
    assert limiter.take("a", 1, now=30.0) == pytest.approx(101 * 0.6)  # -150 + 50 refilled: 101 short at 100/min


def test_a_key_of_its_own_rate_fills_and_refills_at_it() -> None:
    limiter = RateLimiter(per_minute=60)
    assert limiter.take("a", 10, now=0.0, per_minute=10) == 0.0
    assert limiter.take("a", 1, now=0.0, per_minute=10) == pytest.approx(6.0)  # one unit every 6 s
    assert limiter.take("b", 60, now=0.0) == 0.0  # the limiter's own rate for the others
