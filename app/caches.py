"""In-process caches that stay bounded by evicting their least recently written entries: a full cache drops its
oldest tenth, never everything at once (one flood of new keys cannot wipe, say, every user's rate-limit debt).
Every cached value here can be re-read from the database, or is cheap to lose."""

from __future__ import annotations

from itertools import islice
from typing import TypeVar

K = TypeVar("K")
V = TypeVar("V")

EVICTED_SHARE = 10  # a full cache drops 1/EVICTED_SHARE of its entries, the least recently written


def remember(cache: dict[K, V], key: K, value: V, limit: int = 100_000) -> V:
    """Keep `value` under `key` as the most recently written entry; when `cache` already holds `limit` entries and
    `key` is new, first drop its least recently written tenth (a dict keeps insertion order, so they are its first:
    dropped in one batch, the cost stays constant per write). Returns `value`."""
    if key in cache:
        del cache[key]  # re-inserted last: the most recent
    elif len(cache) >= limit:
        for old in list(islice(cache, max(1, limit // EVICTED_SHARE))):
            del cache[old]
    cache[key] = value
    return value
