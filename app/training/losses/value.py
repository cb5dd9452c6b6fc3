"""The critic's loss: PPO's clipped value loss, summed like every Tinker loss.

v = the critic's predicted values (gradient flows through them), v_old = `values` (the critic's values
when the data was collected), R = `returns`, w = `weights` (default 1), c = `value_clip`:
L = sum_t w_t * 1/2 * max((v_t - R_t)^2, (v_old_t + clip(v_t - v_old_t, -c, c) - R_t)^2).
"""

from __future__ import annotations

import torch


def ppo_critic(
    values: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    config: dict[str, float],
    datum_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    old, returns = inputs["values"], inputs["returns"]
    weights = inputs.get("weights")
    clip = config["value_clip"]
    clipped = old + torch.clamp(values - old, -clip, clip)
    squared = torch.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    elementwise = 0.5 * squared if weights is None else 0.5 * weights * squared
    return elementwise.sum(), elementwise
