"""Dimuon (app.training.dimuon): hand-derived small cases, the orthogonalisation property, and a LoRA engine step."""

from __future__ import annotations

import math

import pytest
import torch

from app.errors import UserError
from app.messages import AdamParams, AdapterSpec, DimuonParams
from app.training.base_model import load_base_model
from app.training.dimuon import Dimuon, direction, orthogonalize
from app.training.engine import TrainingEngine
from app.training.optim import apply_step, make_optimizer
from tests.conftest import TINY_MODEL
from tests.unit.training.test_engine import make_batch


def test_a_vector_steps_lr_along_its_unit_gradient() -> None:
    """A 1 x n matrix has one singular value: its orthogonal direction is m / |m|, here g / |g| = [0.6, -0.8]."""
    p = torch.nn.Parameter(torch.tensor([[1.0, 2.0]]))
    p.grad = torch.tensor([[3.0, -4.0]])
    opt = make_optimizer([p], "dimuon")
    assert isinstance(opt, Dimuon)
    apply_step(opt, [p], DimuonParams(learning_rate=0.1, beta1=0.5))
    assert p.detach().tolist() == [[pytest.approx(0.94), pytest.approx(2.08)]]
    assert opt.state[p]["momentum"].tolist() == [[1.5, -2.0]]  # (1 - beta1) * g
    assert p.grad is None


def test_momentum_is_an_ema_of_the_gradients() -> None:
    p = torch.nn.Parameter(torch.zeros(2, 3))
    opt = make_optimizer([p], "dimuon")
    g1, g2 = torch.randn(2, 3), torch.randn(2, 3)
    for g in (g1, g2):
        p.grad = g.clone()
        apply_step(opt, [p], DimuonParams(learning_rate=0.0, beta1=0.9))
    torch.testing.assert_close(opt.state[p]["momentum"], 0.9 * 0.1 * g1 + 0.1 * g2)


def test_orthogonalisation_pushes_every_singular_value_towards_one() -> None:
    torch.manual_seed(0)
    for shape in ((8, 64), (64, 8)):  # a LoRA A (r x d_in) and a B (d_out x r)
        u, _ = torch.linalg.qr(torch.randn(shape[0], 8))
        v, _ = torch.linalg.qr(torch.randn(shape[1], 8))
        m = u @ torch.diag(torch.logspace(-1, 1, 8)) @ v.T
        sv = torch.linalg.svdvals(orthogonalize(m))  # from singular values spread over 100x ...
        assert sv.min() > 0.6 and sv.max() < 1.25, sv  # ... to within the iteration's band around 1
        d = direction(m)
        assert float(torch.linalg.matrix_norm(d)) == pytest.approx(math.sqrt(8), rel=1e-5)  # sqrt(rank)
        u, _, vh = torch.linalg.svd(m, full_matrices=False)  # the same singular vectors as m's polar factor
        assert float((d * (u @ vh)).sum() / math.sqrt(8) ** 2) > 0.9


def test_a_diagonal_momentum_steps_along_the_identity_and_zero_takes_no_step() -> None:
    d = direction(torch.diag(torch.tensor([3.0, 0.5])))
    assert d[0, 1] == 0 and d[1, 0] == 0
    torch.testing.assert_close(d, torch.eye(2), atol=0.3, rtol=0)  # U V^T = I, approximately
    assert torch.equal(direction(torch.zeros(4, 2)), torch.zeros(4, 2))


def test_the_optimizer_is_the_models_own() -> None:
    p = torch.nn.Parameter(torch.ones(2, 2))
    p.grad = torch.ones(2, 2)
    with pytest.raises(UserError) as info:
        apply_step(make_optimizer([p], "dimuon"), [p], AdamParams())
    assert info.value.field == "adam_params"
    with pytest.raises(UserError) as info:
        apply_step(make_optimizer([p]), [p], DimuonParams(learning_rate=0.1))
    assert info.value.field == "optimizer_params"


def test_a_lora_model_trains_with_dimuon() -> None:
    engine = TrainingEngine(load_base_model(str(TINY_MODEL)))
    engine.create_model("m", AdapterSpec(rank=4, seed=7, optimizer="dimuon"))
    batch = make_batch([6, 9])
    losses = []
    for _ in range(4):
        losses.append(engine.forward_backward("m", "cross_entropy", {}, batch, forward_only=False).loss_sum)
        engine.optim_step("m", DimuonParams(learning_rate=0.02))
    assert losses[-1] < losses[0], losses
    state = engine.adapter_state("m")
    b = next(v for k, v in state.items() if "lora_B" in k)
    assert float(torch.linalg.matrix_norm(b)) > 0  # B moved from its zero start
