"""Splitting a rank's shard of datums into micro-batches: forward and backward passes whose gradients accumulate, so
a request's activation memory is bounded by one micro-batch however many datums it has. Tinker's losses are sums
over tokens, so the split changes only the order of float additions."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def micro_batches(lengths: np.ndarray, max_tokens: int) -> list[slice]:
    """Consecutive runs of datums (of these token `lengths`) whose padded size, datums x the longest, is at most
    `max_tokens`; a datum longer than that is a micro-batch of its own."""
    runs: list[slice] = []
    start, longest = 0, 0
    for i, length in enumerate(lengths.tolist()):
        longest_with = max(longest, length)
        if i > start and (i - start + 1) * longest_with > max_tokens:
            runs.append(slice(start, i))
            start, longest_with = i, length
        longest = longest_with
    if len(lengths):
        runs.append(slice(start, len(lengths)))
    return runs


def fits_one_pass(batches: Sequence[np.ndarray], world_size: int, max_tokens: int) -> bool:
    """Whether the datums of several batches (their token lengths) fit one micro-batch on every rank together: rank r
    takes datums r, r + world_size, ... of each (app.training.rows.shard_indices), padded to the longest of all."""
    for rank in range(world_size):
        lengths = np.concatenate([lengths[rank::world_size] for lengths in batches]) if batches else np.zeros(0)
        if len(lengths) and len(lengths) * int(lengths.max()) > max_tokens:
            return False
    return True
