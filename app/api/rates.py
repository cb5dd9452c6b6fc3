"""Token-bucket rate limits by key (app.api.quotas uses them for requests per key and sampled tokens per user)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from app.caches import remember


@dataclass
class RateLimiter:
    """Token buckets by key: `per_minute` units a minute, up to a minute's worth at once. A request larger than
    that passes when its bucket is full, and the bucket owes the rest. Per process (each ingress replica)."""

    per_minute: float
    _buckets: dict[str, tuple[float, float]] = field(default_factory=dict)  # key -> (level, when)

    def take(self, key: str, amount: float, now: float | None = None, per_minute: float | None = None) -> float:
        """Take `amount` for `key`: 0.0 when granted, else the seconds until it would be. `per_minute`: this key's
        own rate, instead of the limiter's."""
        now = time.monotonic() if now is None else now
        per_minute = self.per_minute if per_minute is None else per_minute
        level = self._level(key, now, per_minute)
        if amount <= level or level >= per_minute:
            remember(self._buckets, key, (level - amount, now))
            return 0.0
        remember(self._buckets, key, (level, now))
        return (min(amount, per_minute) - level) * 60.0 / per_minute

    def waiting(self, key: str, now: float | None = None) -> float:
        """The seconds until `key` may take one unit (0.0: now), taking nothing."""
        level = self._level(key, time.monotonic() if now is None else now, self.per_minute)
        return 0.0 if level >= 1 else (1 - level) * 60.0 / self.per_minute

    def _level(self, key: str, now: float, per_minute: float) -> float:
        level, at = self._buckets.get(key, (per_minute, now))
        return min(per_minute, level + (now - at) * per_minute / 60.0)
