"""The RL losses against the protocol's formulas (values) and hand-derived gradients, token by token."""

from __future__ import annotations

import math

import pytest
import torch

from app.errors import UserError
from app.training.losses.functions import LOSS_FUNCTIONS
from app.training_data.losses import get_loss, resolve_config

N = 12


def batch(seed: int = 0) -> tuple[torch.Tensor, dict[str, torch.Tensor], torch.Tensor]:
    """Learner logprobs, inputs with ratios well inside and outside the clip ranges, and two datums."""
    g = torch.Generator().manual_seed(seed)
    q = -torch.rand(N, generator=g, dtype=torch.float64) * 3 - 0.1
    lp = q + (torch.rand(N, generator=g, dtype=torch.float64) - 0.5) * 1.6  # r in about [0.45, 2.2]
    advantages = torch.randn(N, generator=g, dtype=torch.float64)
    mask = (torch.rand(N, generator=g) > 0.3).to(torch.float64)
    datum_ids = torch.tensor([0] * 5 + [1] * 7)
    return lp, {"logprobs": q, "advantages": advantages, "sequence_ratio_mask": mask}, datum_ids


def run(name: str, config: dict, seed: int = 0) -> tuple[float, list[float], torch.Tensor, dict, torch.Tensor]:
    lp, inputs, ids = batch(seed)
    lp = lp.clone().requires_grad_(True)
    loss, _ = LOSS_FUNCTIONS[name](lp, inputs, resolve_config(name, config), ids)
    loss.backward()
    return loss.item(), lp.grad.tolist(), lp.detach(), inputs, ids


def clip(x: float, lo: float, hi: float) -> float:
    return min(max(x, lo), hi)


def clipped_terms(r: float, a: float, lo: float, hi: float) -> tuple[float, float]:
    """(loss term, its derivative wrt log r) of -min(r a, clip(r) a)."""
    unclipped, clipped = r * a, clip(r, lo, hi) * a
    if unclipped <= clipped or lo <= r <= hi:
        return -unclipped, -unclipped
    return -clipped, 0.0


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}])
def test_ppo(config: dict) -> None:
    lo, hi = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
    loss, grad, lp, inputs, _ = run("ppo", config)
    terms = [
        clipped_terms(math.exp(lp[t] - inputs["logprobs"][t]), inputs["advantages"][t].item(), lo, hi) for t in range(N)
    ]
    assert loss == pytest.approx(sum(v for v, _ in terms), rel=1e-12)
    assert grad == pytest.approx([d for _, d in terms], rel=1e-9, abs=1e-12)
    assert any(d == 0.0 for _, d in terms) and any(d != 0.0 for _, d in terms)  # both branches exercised


def test_importance_sampling() -> None:
    loss, grad, lp, inputs, _ = run("importance_sampling", {})
    r = [math.exp(lp[t] - inputs["logprobs"][t]) for t in range(N)]
    a = inputs["advantages"].tolist()
    assert loss == pytest.approx(-sum(x * y for x, y in zip(r, a)), rel=1e-12)
    assert grad == pytest.approx([-x * y for x, y in zip(r, a)], rel=1e-9)


def test_importance_sampling_on_policy_is_minus_sum_of_advantages() -> None:
    lp, inputs, ids = batch()
    inputs["logprobs"] = lp.clone()
    loss, _ = LOSS_FUNCTIONS["importance_sampling"](lp, inputs, {}, ids)
    assert loss.item() == pytest.approx(-inputs["advantages"].sum().item(), rel=1e-12)


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.5, "clip_high_threshold": 1.5}])
def test_cispo(config: dict) -> None:
    lo, hi = config.get("clip_low_threshold", 0.0), config.get("clip_high_threshold", 4.0)
    loss, grad, lp, inputs, _ = run("cispo", config)
    w = [clip(math.exp(lp[t] - inputs["logprobs"][t]), lo, hi) for t in range(N)]
    a = inputs["advantages"].tolist()
    assert loss == pytest.approx(-sum(w[t] * lp[t].item() * a[t] for t in range(N)), rel=1e-12)
    assert grad == pytest.approx([-w[t] * a[t] for t in range(N)], rel=1e-9)


@pytest.mark.parametrize("beta", [0.05, 0.5])
def test_dro(beta: float) -> None:
    loss, grad, lp, inputs, _ = run("dro", {"beta": beta})
    q, a = inputs["logprobs"].tolist(), inputs["advantages"].tolist()
    lps = lp.tolist()
    assert loss == pytest.approx(-sum(lps[t] * a[t] - 0.5 * beta * (lps[t] - q[t]) ** 2 for t in range(N)), rel=1e-12)
    assert grad == pytest.approx([-(a[t] - beta * (lps[t] - q[t])) for t in range(N)], rel=1e-9)


@pytest.mark.parametrize("config", [{}, {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}])
def test_gspo(config: dict) -> None:
    lo, hi = config.get("clip_low_threshold", 1 - 3e-4), config.get("clip_high_threshold", 1 + 4e-4)
    loss, grad, lp, inputs, ids = run("gspo", config, seed=3)
    q, a, m = inputs["logprobs"].tolist(), inputs["advantages"].tolist(), inputs["sequence_ratio_mask"].tolist()
    expected_loss, expected_grad = 0.0, []
    for t in range(N):
        members = [u for u in range(N) if ids[u] == ids[t] and m[u] != 0]
        rho = sum(lp[u].item() - q[u] for u in members) / max(len(members), 1)
        value, derivative = clipped_terms(math.exp(rho), a[t], lo, hi)
        expected_loss += value
        expected_grad.append(derivative)
    assert loss == pytest.approx(expected_loss, rel=1e-12)
    assert grad == pytest.approx(expected_grad, rel=1e-9, abs=1e-12)


def test_configs_are_checked() -> None:
    assert get_loss("stable_reinforce").needs_provenance and not get_loss("ppo").needs_provenance
    with pytest.raises(UserError) as info:
        resolve_config("ppo", {"clip_epsilon": 0.2})
    assert info.value.field == "loss_fn_config"
    with pytest.raises(UserError):
        resolve_config("importance_sampling", {"beta": 1.0})
    assert resolve_config("dro", {}) == {"beta": 0.05}
