"""cross_entropy: L = -sum_t w_t * lp_t (also for (N, K) soft targets: -sum_t sum_k w_tk * lp_tk)."""

from __future__ import annotations

import torch


def cross_entropy(
    target_logprobs: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    config: dict[str, float],
    datum_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    weights = inputs.get("weights")
    if weights is None:
        weights = torch.ones_like(target_logprobs)
    elementwise = -weights * target_logprobs
    return elementwise.sum(), elementwise
