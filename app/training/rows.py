"""A shard's datums as right-padded rows for the model, and back: each datum's tokens in order."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from app.training_data.batch import PackedBatch


def shard_indices(num_datums: int, rank: int, world_size: int) -> np.ndarray:
    """The datums of a request that are this rank's: every world_size-th from `rank`."""
    return np.arange(rank, num_datums, world_size, dtype=np.int64)


def padded(shards: Sequence[PackedBatch], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """The shards' datums, in order, as right-padded input ids and their attention mask, both [N, max_len]."""
    longest = max(int(shard.lengths.max()) for shard in shards)
    input_ids = torch.zeros((sum(shard.num_datums for shard in shards), longest), dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    row = 0
    for shard in shards:
        for i, length in enumerate(shard.lengths.tolist()):
            input_ids[row, :length] = torch.from_numpy(shard.tokens[shard.datum_slice(i)])
            mask[row, :length] = 1
            row += 1
    return input_ids.to(device), mask.to(device)


def unpadded(padded: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
    """The rows of right-padded `padded` [N, L, ...] that hold tokens, datums in order: [sum(lengths), ...]. What
    `padded[mask.bool()]` gives, without the device sync of a boolean index, and a view when nothing is padded."""
    n, width = padded.shape[:2]
    flat = padded.reshape(n * width, *padded.shape[2:])
    if bool((lengths == width).all()):
        return flat
    rows = np.concatenate([i * width + np.arange(length) for i, length in enumerate(lengths)])
    return flat.index_select(0, torch.from_numpy(rows).to(padded.device))
