"""In-process caches that stay bounded: a full cache is emptied, and its entries are read again on their next miss
(every cached value here can be re-read from the database, or is cheap to lose)."""

from __future__ import annotations

from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")


def remember(cache: dict[K, V], key: K, value: V, limit: int = 100_000) -> V:
    """Keep `value` under `key`, emptying `cache` first when it already holds `limit` entries; returns `value`."""
    if len(cache) >= limit and key not in cache:
        cache.clear()
    cache[key] = value
    return value
