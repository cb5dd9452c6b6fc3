"""The RL losses of Tinker (reference: tinker-protocol section 9). Every loss is a sum over tokens.

lp = learner logprobs of target_tokens (gradient flows through them), q = sampler logprobs (`logprobs`),
A = `advantages`, r = exp(lp - q).
"""

from __future__ import annotations

import torch


def _ratio(lp: torch.Tensor, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.exp(lp - inputs["logprobs"])


def _clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, lo: float, hi: float) -> torch.Tensor:
    return torch.minimum(ratio * advantages, torch.clamp(ratio, lo, hi) * advantages)


def importance_sampling(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float], datum_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """L = -sum r * A."""
    elementwise = -_ratio(lp, inputs) * inputs["advantages"]
    return elementwise.sum(), elementwise


def ppo(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float], datum_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """L = -sum min(r A, clip(r, lo, hi) A); the thresholds are ratio bounds, not epsilons."""
    elementwise = -_clipped_objective(
        _ratio(lp, inputs), inputs["advantages"], config["clip_low_threshold"], config["clip_high_threshold"]
    )
    return elementwise.sum(), elementwise


def cispo(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float], datum_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """L = -sum sg[clip(r, lo, hi)] * lp * A."""
    weight = torch.clamp(_ratio(lp, inputs), config["clip_low_threshold"], config["clip_high_threshold"]).detach()
    elementwise = -weight * lp * inputs["advantages"]
    return elementwise.sum(), elementwise


def dro(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float], datum_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """L = -sum (lp A - beta/2 (lp - q)^2)."""
    elementwise = -(lp * inputs["advantages"] - 0.5 * config["beta"] * (lp - inputs["logprobs"]) ** 2)
    return elementwise.sum(), elementwise


def gspo(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float], datum_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """GSPO-token: each datum's ratio is exp(mean over its masked tokens of (lp - q)); the token term
    s_t = exp(rho + lp_t - sg[lp_t]) has that value and the gradient of lp_t; then the PPO clip."""
    if datum_ids is None:
        datum_ids = torch.zeros_like(lp, dtype=torch.long)
    mask = (inputs["sequence_ratio_mask"] != 0).to(lp.dtype)
    n = int(datum_ids.max()) + 1 if datum_ids.numel() else 0
    log_ratio = (lp.detach() - inputs["logprobs"]) * mask
    sums = torch.zeros(n, dtype=lp.dtype, device=lp.device).index_add_(0, datum_ids, log_ratio)
    counts = torch.zeros(n, dtype=lp.dtype, device=lp.device).index_add_(0, datum_ids, mask)
    rho = (sums / counts.clamp(min=1))[datum_ids]
    token_ratio = torch.exp(rho + lp - lp.detach())
    elementwise = -_clipped_objective(
        token_ratio, inputs["advantages"], config["clip_low_threshold"], config["clip_high_threshold"]
    )
    return elementwise.sum(), elementwise
