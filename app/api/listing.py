"""Listings that show user metadata stay small: a page's metadata is bounded by limits.max_listing_metadata_bytes,
shared equally by its items; an item beyond its share shows the entries that fit, marked truncated. The item's own
view (or a smaller page) shows it whole."""

from __future__ import annotations

import json
from collections.abc import Sequence


def metadata_share(page_budget: int, items: Sequence[object]) -> int:
    """Each item's share of a page's metadata budget."""
    return page_budget // max(1, len(items))


def listed_metadata(metadata: dict[str, str], share: int) -> dict:
    """What a listing changes in an item's view: nothing when its user_metadata fits in `share` bytes of JSON, else
    the entries, in order, that fit, and `user_metadata_truncated: true`."""
    if len(json.dumps(metadata)) <= share:
        return {}
    kept: dict[str, str] = {}
    size = 2  # the braces
    for key, value in metadata.items():
        size += len(json.dumps({key: value})) - 2 + (2 if kept else 0)  # the entry, and ", " before it
        if size > share:
            break
        kept[key] = value
    return {"user_metadata": kept, "user_metadata_truncated": True}
