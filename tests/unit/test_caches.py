"""remember: a bounded cache empties itself when full, and replacing a key never does."""

from __future__ import annotations

from app.caches import remember


def test_a_full_cache_is_emptied_before_a_new_key() -> None:
    cache: dict[str, int] = {}
    assert [remember(cache, k, i, limit=3) for i, k in enumerate("abc")] == [0, 1, 2]
    remember(cache, "b", 9, limit=3)  # a known key: replaced in place
    assert cache == {"a": 0, "b": 9, "c": 2}
    remember(cache, "d", 3, limit=3)
    assert cache == {"d": 3}
