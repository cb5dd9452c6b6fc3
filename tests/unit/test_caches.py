"""remember: a full cache drops its least recently written tenth, never everything; writing a key makes it recent."""

from __future__ import annotations

from app.caches import remember


def test_a_full_cache_keeps_its_recent_entries() -> None:
    cache: dict[int, int] = {}
    for key in range(100):
        remember(cache, key, key, limit=100)
    remember(cache, 0, -1, limit=100)  # rewritten: now the most recent
    remember(cache, 100, 100, limit=100)  # full: the ten least recently written go (1..10), not the rest
    assert len(cache) == 91 and cache[0] == -1 and 100 in cache and 99 in cache
    assert not any(key in cache for key in range(1, 11)) and all(key in cache for key in range(11, 100))
