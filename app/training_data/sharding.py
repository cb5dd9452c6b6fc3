"""Merging the ranks' shard outputs back into one request-ordered ForwardBackwardResult."""

from __future__ import annotations

import numpy as np

from app.messages import ShardOutput
from app.training_data.batch import ForwardBackwardResult


def merge_shards(batch_offsets: np.ndarray, shards: list[ShardOutput]) -> ForwardBackwardResult:
    """Place every rank's per-datum outputs at the datum's position in the request."""
    total = int(batch_offsets[-1])
    names = next((s.outputs.keys() for s in shards if s.outputs), ())
    merged: dict[str, np.ndarray] = {}
    for name in names:
        sample = next(s.outputs[name] for s in shards if s.outputs)
        out = np.empty((total, *sample.shape[1:]), dtype=sample.dtype)
        for shard in shards:
            for j, datum in enumerate(shard.datum_indices):
                dst = slice(int(batch_offsets[datum]), int(batch_offsets[datum + 1]))
                out[dst] = shard.outputs[name][int(shard.offsets[j]) : int(shard.offsets[j + 1])]
        merged[name] = out
    metrics: dict[str, float] = {"loss:sum": float(sum(s.loss_sum for s in shards))}
    for name in sorted({name for s in shards for name in s.stats}):  # a loss's metrics: `:sum` summed, else sum / count
        parts = [s.stats[name] for s in shards if name in s.stats]
        count = sum(c for _, c in parts)
        summed = float(sum(t for t, _ in parts))
        metrics[name] = summed if name.endswith(":sum") else summed / count if count else 0.0
    return ForwardBackwardResult(offsets=batch_offsets, outputs=merged, metrics=metrics)
