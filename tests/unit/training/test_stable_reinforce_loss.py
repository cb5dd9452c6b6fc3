"""stable_reinforce against values and gradients derived by hand from its formula (see its module docstring)."""

from __future__ import annotations

import math

import pytest
import torch

from app.training.losses.stable_reinforce import stable_reinforce, stable_reinforce_stats
from app.training_data.losses import SAMPLED_MASK, SAMPLER_LOGPROBS, resolve_config


def _run(
    lp: list[float], q: list[float], adv: list[float], sampled: list[float], **config: float
) -> tuple[float, list[float], list[float], dict[str, float]]:
    cfg = resolve_config("stable_reinforce", config)
    x = torch.tensor(lp, dtype=torch.float64, requires_grad=True)
    inputs = {
        SAMPLER_LOGPROBS: torch.tensor(q, dtype=torch.float64),
        "advantages": torch.tensor(adv, dtype=torch.float64),
        SAMPLED_MASK: torch.tensor(sampled, dtype=torch.float64),
    }
    loss, elementwise = stable_reinforce(x, inputs, cfg, torch.zeros(len(lp), dtype=torch.long))
    loss.backward()
    stats = {k: s / c for k, (s, c) in stable_reinforce_stats(x.detach(), inputs, cfg).items()}
    return float(loss.detach()), elementwise.detach().tolist(), x.grad.tolist(), stats


def _by_hand(lp: float, q: float, adv: float, kept: bool, cap: float, kl: float) -> tuple[float, float]:
    """(loss, d loss / d lp) of one sampled token."""
    r = math.exp(lp - q)
    if not kept:
        return 0.0, 0.0
    w = min(r, cap)
    return -w * adv * lp + kl * (r - 1 - (lp - q)), -w * adv + kl * (r - 1)


def test_values_and_gradients_match_the_formula() -> None:
    lp = [-1.0, -2.0, -0.5, -3.0, -1.5]
    q = [-1.2, -1.0, -0.5, -0.2, -1.5]  # ratios e^0.2, e^-1 (kept), 1, e^-2.8 (below 0.2: dropped), 1 (a prompt token)
    adv = [1.5, -0.5, 2.0, 1.0, 0.0]
    sampled = [1.0, 1.0, 1.0, 1.0, 0.0]
    loss, elementwise, grad, stats = _run(lp, q, adv, sampled, kl_coeff=0.3, ratio_cap=1.1, mask_low=0.2, mask_high=5)
    kept = [True, True, True, False, False]
    want = [_by_hand(*t, cap=1.1, kl=0.3) for t in zip(lp, q, adv, kept)]
    assert elementwise == pytest.approx([w[0] for w in want], rel=1e-12)
    assert loss == pytest.approx(sum(w[0] for w in want), rel=1e-12)
    assert grad == pytest.approx([w[1] for w in want], rel=1e-12, abs=1e-15)
    ratios = [math.exp(a - b) for a, b in zip(lp[:4], q[:4])]
    assert stats["stable_reinforce/masked_fraction:mean"] == pytest.approx(1 / 4)
    assert stats["stable_reinforce/ratio:mean"] == pytest.approx(sum(ratios) / 4)
    assert stats["stable_reinforce/kl:mean"] == pytest.approx(sum(r - 1 - math.log(r) for r in ratios) / 4)


def test_on_policy_without_kl_is_the_plain_policy_gradient() -> None:
    lp, adv = [-0.7, -1.9, -0.1], [0.5, -2.0, 1.0]
    _, _, grad, stats = _run(lp, lp, adv, [1.0, 1.0, 1.0])
    assert grad == pytest.approx([-a for a in adv], rel=1e-12)
    assert stats["stable_reinforce/ratio:mean"] == pytest.approx(1.0)
    assert stats["stable_reinforce/kl:mean"] == pytest.approx(0.0, abs=1e-15)


def test_a_ratio_above_the_band_is_dropped_and_the_weight_is_capped() -> None:
    # ratios e^2 (above mask_high 5: dropped) and e^1 = 2.72 (kept, weight capped at 2)
    _, elementwise, grad, stats = _run([0.0, 0.0], [-2.0, -1.0], [1.0, 1.0], [1.0, 1.0], mask_high=5)
    assert elementwise[0] == 0.0 and grad[0] == 0.0
    assert grad[1] == pytest.approx(-2.0)
    assert stats["stable_reinforce/masked_fraction:mean"] == pytest.approx(0.5)


def test_the_default_band_drops_ratios_beyond_a_factor_of_two() -> None:
    assert resolve_config("stable_reinforce", {}) == {
        "kl_coeff": 0.0,
        "ratio_cap": 2.0,
        "mask_low": 0.5,
        "mask_high": 2.0,
    }
    # ratios e^-0.8 = 0.45 and e^0.8 = 2.23 leave [0.5, 2]; e^0.5 = 1.65 stays
    _, _, grad, stats = _run([0.0, 0.0, 0.0], [0.8, -0.8, -0.5], [1.0, 1.0, 1.0], [1.0, 1.0, 1.0])
    assert grad[:2] == [0.0, 0.0] and grad[2] == pytest.approx(-math.exp(0.5))
    assert stats["stable_reinforce/masked_fraction:mean"] == pytest.approx(2 / 3)
