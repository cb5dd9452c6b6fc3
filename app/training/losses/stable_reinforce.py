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

import torch

from app.training.losses import SAMPLED_MASK, SAMPLER_LOGPROBS


def _parts(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ratio r, sampled mask m, kept mask k)."""
    log_ratio = lp - inputs[SAMPLER_LOGPROBS]
    ratio = torch.exp(log_ratio)
    sampled = inputs[SAMPLED_MASK]
    in_band = (ratio >= config["mask_low"]) & (ratio <= config["mask_high"])
    return ratio, sampled, sampled * in_band.to(lp.dtype)


def stable_reinforce(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float], datum_ids: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    ratio, _, kept = _parts(lp, inputs, config)
    weight = torch.clamp(ratio, max=config["ratio_cap"]).detach()
    log_ratio = lp - inputs[SAMPLER_LOGPROBS]
    kl = ratio - 1 - log_ratio
    elementwise = kept * (-weight * inputs["advantages"] * lp + config["kl_coeff"] * kl)
    return elementwise.sum(), elementwise


def stable_reinforce_stats(
    lp: torch.Tensor, inputs: dict[str, torch.Tensor], config: dict[str, float]
) -> dict[str, tuple[float, float]]:
    """(sum, count) over sampled targets of: the dropped fraction, the ratio, and the KL estimate."""
    with torch.no_grad():
        ratio, sampled, kept = _parts(lp, inputs, config)
        count = float(sampled.sum())
        kl = ratio - 1 - (lp - inputs[SAMPLER_LOGPROBS])
        return {
            "stable_reinforce/masked_fraction:mean": (float((sampled - kept).sum()), count),
            "stable_reinforce/ratio:mean": (float((sampled * ratio).sum()), count),
            "stable_reinforce/kl:mean": (float((sampled * kl).sum()), count),
        }
