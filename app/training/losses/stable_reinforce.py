"""stable_reinforce: an off-policy policy gradient that stays stable when samples are several steps stale.

With lp = learner logprobs of the targets (gradient flows through them), q = `sampler_logprobs` (what the
sampler recorded when it produced each token, read server-side from its stability record, never from the
client), A = `advantages`, m = `sampled_mask` (1 at sampled targets) and r = exp(lp - q):

    k_t = m_t * [mask_low <= r_t <= mask_high]            tokens whose ratio left the trust band are dropped
    w_t = stop_gradient(min(r_t, ratio_cap))              truncated importance weight
    L   = sum_t k_t * ( -w_t * A_t * lp_t  +  kl_coeff * (r_t - 1 - log r_t) )

The first term is REINFORCE corrected by a truncated importance weight (truncated importance sampling,
Ionides 2008; V-trace's truncated rho, Espeholt et al. 2018): its gradient is -min(r, cap) * A * grad lp, so
no token's step grows with an exploding ratio. Masking tokens whose ratio leaves [mask_low, mask_high] (as
IcePop and masked importance sampling do) drops the tokens where learner and sampler disagree most, which
stale samples and sampler/trainer numeric mismatches produce. The second term is the k3 estimator of
KL(sampler || learner) on the sampler's own tokens (Schulman 2020): non-negative, zero at r = 1, with gradient
kl_coeff * (r - 1) * grad lp pulling the learner back toward the policy that sampled.
At r = 1 and kl_coeff = 0 the gradient is the plain policy gradient -A * grad lp.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from app.training_data.losses import SAMPLED_MASK, SAMPLER_LOGPROBS


class _Terms(NamedTuple):
    ratio: torch.Tensor  # r
    sampled: torch.Tensor  # m
    kept: torch.Tensor  # k
    kl: torch.Tensor  # r - 1 - log r


def _terms(lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]) -> _Terms:
    log_ratio = lp - inputs[SAMPLER_LOGPROBS]
    ratio = torch.exp(log_ratio)
    sampled = inputs[SAMPLED_MASK]
    in_band = (ratio >= config["mask_low"]) & (ratio <= config["mask_high"])
    return _Terms(ratio, sampled, sampled * in_band.to(lp.dtype), ratio - 1 - log_ratio)


def stable_reinforce(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float], datum_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    t = _terms(lp, inputs, config)
    weight = torch.clamp(t.ratio, max=config["ratio_cap"]).detach()
    elementwise = t.kept * (-weight * inputs["advantages"] * lp + config["kl_coeff"] * t.kl)
    return elementwise.sum(), elementwise


def stable_reinforce_stats(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]
) -> dict[str, tuple[float, float]]:
    """(sum, count) over sampled targets of: the dropped fraction, the ratio, and the KL estimate."""
    with torch.no_grad():
        t = _terms(lp, inputs, config)
        count = float(t.sampled.sum())
        return {
            "stable_reinforce/masked_fraction:mean": (float((t.sampled - t.kept).sum()), count),
            "stable_reinforce/ratio:mean": (float((t.sampled * t.ratio).sum()), count),
            "stable_reinforce/kl:mean": (float((t.sampled * t.kl).sum()), count),
        }
