"""Property tests of the losses: hand-derived gradient identities, checked with autograd on hypothesis-drawn inputs.

Conventions of app/training/losses: lp = learner logprobs of the targets (the tensor differentiated), q = sampler
logprobs (`logprobs`), A = `advantages`, r = exp(lp - q); every loss is a plain sum over tokens.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from app.training.losses.functions import LOSS_FUNCTIONS
from app.training_data.losses import get_loss, resolve_config

PG_LOSSES = ("importance_sampling", "ppo", "cispo", "gspo")
DTYPES = {"float32": (torch.float32, 1e-5), "float64": (torch.float64, 1e-12)}  # dtype, relative tolerance

FAST = settings(max_examples=60, deadline=None, database=None)


def reals(lo: float, hi: float) -> st.SearchStrategy[float]:
    """Floats in [lo, hi], 0 or at least 1e-6 in magnitude: (float32) subnormals would round the exact identities."""
    return st.floats(lo, hi).filter(lambda x: x == 0 or abs(x) >= 1e-6)


@st.composite
def rl_batches(draw: st.DrawFn, max_tokens: int = 12) -> dict[str, torch.Tensor]:
    """Learner and sampler logprobs, advantages, a sequence-ratio mask and sorted datum ids (1-3 datums)."""
    n = draw(st.integers(1, max_tokens))
    dtype = DTYPES[draw(st.sampled_from(sorted(DTYPES)))][0]

    def arr(lo: float, hi: float) -> torch.Tensor:
        return torch.tensor(draw(hnp.arrays(np.float64, n, elements=reals(lo, hi))), dtype=dtype)

    ids = sorted(draw(st.lists(st.integers(0, 2), min_size=n, max_size=n)))
    dense = np.unique(ids, return_inverse=True)[1]  # datum ids 0..k-1 with no gaps
    return {
        "lp": arr(-6.0, -0.01),
        "q": arr(-6.0, -0.01),
        "advantages": arr(-3.0, 3.0),
        "mask": torch.tensor(draw(hnp.arrays(np.bool_, n)), dtype=dtype),
        "ids": torch.tensor(dense),
    }


clip_configs = st.fixed_dictionaries(
    {"clip_low_threshold": st.floats(0.0, 0.99), "clip_high_threshold": st.floats(1.01, 5.0)}
)


def grad_of(
    name: str, b: dict[str, torch.Tensor], config: dict[str, float]
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(summed loss, elementwise loss, d loss / d lp) of a registered loss on batch b; config keys the loss does not
    use are dropped."""
    spec = get_loss(name)
    config = resolve_config(name, {k: v for k, v in config.items() if k in (spec.config_defaults or {})})
    lp = b["lp"].clone().requires_grad_(True)
    inputs = {"logprobs": b["q"], "advantages": b["advantages"], "sequence_ratio_mask": b["mask"]}
    loss, elementwise = LOSS_FUNCTIONS[name](lp, inputs, config, b["ids"])
    loss.backward()
    return loss.detach(), elementwise.detach(), lp.grad


def tol(b: dict[str, torch.Tensor]) -> float:
    return DTYPES[str(b["lp"].dtype).removeprefix("torch.")][1]


@FAST
@given(rl_batches(), st.sampled_from(PG_LOSSES), clip_configs, st.data())
def test_zero_advantage_tokens_get_zero_gradient(
    b: dict[str, torch.Tensor], name: str, config: dict[str, float], data: st.DataObject
) -> None:
    """A token whose advantage is 0 gets exactly zero gradient (and adds nothing to the loss) in importance_sampling,
    ppo, cispo and gspo, whatever its ratio and the clip range; in gspo even though it shares its datum's ratio."""
    zero = torch.tensor(data.draw(hnp.arrays(np.bool_, len(b["lp"]))))
    b["advantages"] = torch.where(zero, torch.zeros_like(b["advantages"]), b["advantages"])
    loss, elementwise, grad = grad_of(name, b, config)
    assert torch.all(grad[zero] == 0), grad
    assert torch.all(elementwise[zero] == 0)
    if zero.all():
        assert loss.item() == 0.0


@FAST
@given(rl_batches(), reals(0.0, 2.0))
def test_dro_gradient_at_zero_advantage_is_the_proximal_pull(b: dict[str, torch.Tensor], beta: float) -> None:
    """dro has a quadratic penalty, so zero advantage does not mean zero gradient: it is beta (lp - q), which vanishes
    exactly on-policy; the loss is beta/2 sum (lp - q)^2."""
    b["advantages"] = torch.zeros_like(b["advantages"])
    loss, _, grad = grad_of("dro", b, {"beta": beta})
    diff = b["lp"] - b["q"]
    torch.testing.assert_close(grad, beta * diff, rtol=tol(b), atol=0)
    assert math.isclose(loss.item(), 0.5 * beta * (diff**2).sum().item(), rel_tol=tol(b) * 10, abs_tol=1e-30)
    b["q"] = b["lp"].clone()
    assert torch.all(grad_of("dro", b, {"beta": beta})[2] == 0)


@FAST
@given(rl_batches(), st.sampled_from([*PG_LOSSES, "dro"]), clip_configs, reals(0.0, 2.0))
def test_on_policy_gradient_is_the_policy_gradient(
    b: dict[str, torch.Tensor], name: str, config: dict[str, float], beta: float
) -> None:
    """With the sampler's logprobs equal to the learner's (every ratio 1, inside any clip range; dro's penalty
    vanishes), every policy-gradient loss has exactly the REINFORCE gradient d(-sum A lp)/d lp = -A, token by token."""
    b["q"] = b["lp"].clone()
    *_, grad = grad_of(name, b, {**config, "beta": beta})
    assert torch.equal(grad, -b["advantages"]), (grad, b["advantages"])


REGIONS = ("above", "below", "inside")


@FAST
@given(rl_batches(), st.floats(0.05, 0.5), st.floats(0.05, 0.5), st.data())
def test_ppo_clips_exactly_where_the_bound_binds(
    b: dict[str, torch.Tensor], eps_low: float, eps_high: float, data: st.DataObject
) -> None:
    """PPO with bounds (1 - eps_low, 1 + eps_high): a token with A > 0 and r above the upper bound, or A < 0 and r
    below the lower one, gets exactly zero gradient; every other token (inside the bounds, or outside on the side
    the pessimistic min keeps unclipped) gets the unclipped -r A."""
    lo, hi = 1 - eps_low, 1 + eps_high
    n = len(b["lp"])
    region = data.draw(st.lists(st.sampled_from(REGIONS), min_size=n, max_size=n))
    unit = data.draw(st.lists(st.floats(0.02, 0.98), min_size=n, max_size=n))
    ratio = [
        hi * (1.01 + 2 * u)
        if g == "above"
        else lo * (0.99 - 0.9 * u)
        if g == "below"
        else lo * 1.01 + (hi * 0.99 - lo * 1.01) * u
        for g, u in zip(region, unit)
    ]
    b["lp"] = b["q"] + torch.log(torch.tensor(ratio, dtype=b["q"].dtype))
    a = b["advantages"]
    b["advantages"] = torch.where(a.abs() < 0.01, torch.full_like(a, 0.5), a)  # a clear sign for every token
    *_, grad = grad_of("ppo", b, {"clip_low_threshold": lo, "clip_high_threshold": hi})
    r, a = torch.exp(b["lp"] - b["q"]), b["advantages"]
    clipped = torch.tensor([(g == "above" and x > 0) or (g == "below" and x < 0) for g, x in zip(region, a.tolist())])
    assert torch.all(grad[clipped] == 0)
    torch.testing.assert_close(grad[~clipped], (-r * a)[~clipped], rtol=tol(b), atol=0)
    assert torch.all(grad[~clipped] != 0)


@FAST
@given(rl_batches(), st.data())
def test_gspo_clips_on_the_sequence_ratio(b: dict[str, torch.Tensor], data: st.DataObject) -> None:
    """gspo clips on each datum's ratio exp(mean of masked lp - q), not on the tokens' own ratios: tokens of a datum
    whose sequence ratio is past the binding bound get zero gradient, the others -s A with s the sequence ratio."""
    lo, hi = 0.8, 1.25
    ids, n_datums = b["ids"], int(b["ids"].max()) + 1
    region = data.draw(st.lists(st.sampled_from(REGIONS), min_size=n_datums, max_size=n_datums))
    log_seq = torch.tensor(
        [math.log({"above": hi * 1.5, "below": lo * 0.5, "inside": 1.1}[g]) for g in region], dtype=b["q"].dtype
    )
    noise = b["lp"] - b["q"]  # per-token log ratios, recentred on each datum's masked mean
    for i in range(n_datums):
        rows = (ids == i) & (b["mask"] != 0)
        noise[rows] -= noise[rows].mean()
    b["lp"] = b["q"] + log_seq[ids] + noise
    *_, grad = grad_of("gspo", b, {"clip_low_threshold": lo, "clip_high_threshold": hi})
    a = b["advantages"]
    has_mask = torch.zeros(n_datums, dtype=b["mask"].dtype).index_add_(0, ids, b["mask"])[ids] > 0
    above = torch.tensor([region[i] == "above" for i in ids.tolist()])
    below = torch.tensor([region[i] == "below" for i in ids.tolist()])
    clipped = has_mask & ((above & (a > 0)) | (below & (a < 0)))  # no masked token: sequence ratio 1, never clipped
    s = torch.where(has_mask, torch.exp(log_seq[ids]), torch.ones_like(a))
    assert torch.all(grad[clipped] == 0)
    torch.testing.assert_close(grad[~clipped], (-s * a)[~clipped], rtol=10 * tol(b), atol=0)  # s: a recentred mean


@FAST
@given(st.integers(1, 12), st.sampled_from([(), (1,), (4,)]), st.sampled_from(sorted(DTYPES)), st.booleans(), st.data())
def test_cross_entropy_is_minus_weighted_sum(
    n: int, trailing: tuple[int, ...], dtype_name: str, weighted: bool, data: st.DataObject
) -> None:
    """cross_entropy = -sum(w * lp) over (N,) or (N, K) targets, elementwise -w * lp, and its gradient is exactly -w
    (w = 1 when no weights are sent)."""
    dtype, rtol = DTYPES[dtype_name]
    shape = (n, *trailing)
    lp = torch.tensor(data.draw(hnp.arrays(np.float64, shape, elements=reals(-20.0, 0.0))), dtype=dtype)
    w = torch.tensor(data.draw(hnp.arrays(np.float64, shape, elements=reals(-2.0, 5.0))), dtype=dtype)
    inputs = {"weights": w} if weighted else {}
    if not weighted:
        w = torch.ones_like(lp)
    lp.requires_grad_(True)
    loss, elementwise = LOSS_FUNCTIONS["cross_entropy"](lp, inputs, {}, torch.zeros(n, dtype=torch.long))
    loss.backward()
    assert torch.equal(lp.grad, -w)  # exact here and below: elementwise, each entry one product, no sum
    assert torch.equal(elementwise.detach(), -w * lp.detach())
    expected = -(w.double() * lp.detach().double()).sum().item()
    scale = (w.double() * lp.detach().double()).abs().sum().item()
    assert abs(loss.item() - expected) <= rtol * 10 * scale + 1e-30
