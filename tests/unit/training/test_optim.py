"""apply_step: clipping, per-step AdamW hyper-parameters, gradients cleared — against hand-derived values."""

from __future__ import annotations

import pytest
import torch

from app.messages import AdamParams
from app.training.optim import apply_step, make_optimizer


def _param(values: list[float], grad: list[float] | None) -> torch.nn.Parameter:
    p = torch.nn.Parameter(torch.tensor(values))
    if grad is not None:
        p.grad = torch.tensor(grad)
    return p


def test_first_step_is_lr_times_sign_and_clip_scales_moments() -> None:
    p = _param([1.0, -2.0], [3.0, -4.0])  # |g| = 5
    opt = make_optimizer([p])
    norm = apply_step(opt, [p], AdamParams(learning_rate=0.1, grad_clip_norm=1.0))
    assert norm == pytest.approx(5.0)
    # Adam's first step: m_hat / sqrt(v_hat) = g / |g| element-wise, whatever the clipping.
    assert p.detach().tolist() == pytest.approx([0.9, -1.9], abs=1e-6)
    # The clipped gradient (norm 1) is what the moments saw: exp_avg = (1 - 0.9) * [0.6, -0.8].
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.06, -0.08], abs=1e-6)
    assert p.grad is None


def test_no_clip_when_under_norm_and_weight_decay_is_decoupled() -> None:
    p = _param([1.0, -2.0], [0.3, 0.4])  # |g| = 0.5 < clip
    opt = make_optimizer([p])
    apply_step(opt, [p], AdamParams(learning_rate=0.1, weight_decay=0.5, grad_clip_norm=1.0))
    # AdamW: p *= 1 - lr * wd (0.95), then p -= lr * sign(g).
    assert p.detach().tolist() == pytest.approx([0.95 - 0.1, -1.9 - 0.1], abs=1e-6)
    assert opt.state[p]["exp_avg"].tolist() == pytest.approx([0.03, 0.04], abs=1e-6)
    assert opt.param_groups[0]["betas"] == (0.9, 0.95)


def test_hyper_parameters_change_per_step() -> None:
    p = _param([0.0], [1.0])
    opt = make_optimizer([p])
    apply_step(opt, [p], AdamParams(learning_rate=0.5))
    assert p.item() == pytest.approx(-0.5)
    assert opt.param_groups[0]["lr"] == 0.5
    p.grad = torch.tensor([1.0])
    apply_step(opt, [p], AdamParams(learning_rate=0.25, beta1=0.0, beta2=0.0))
    # beta1 = beta2 = 0: m_hat = g, v_hat = g^2 -> another lr * sign(g).
    assert p.item() == pytest.approx(-0.75)


def test_no_gradients_no_change() -> None:
    p = _param([1.0, 2.0], None)
    opt = make_optimizer([p])
    assert apply_step(opt, [p], AdamParams(learning_rate=1.0, weight_decay=0.1)) == 0.0
    assert p.detach().tolist() == [1.0, 2.0]
