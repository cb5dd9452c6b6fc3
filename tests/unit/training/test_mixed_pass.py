"""Several models' requests as one pass over the base (TrainingEngine.forward_backward_many) equal the same requests
one after another: outputs, losses, metrics, gradients and the weights after an optimizer step, for every loss kind
(built-in policy losses, stable_reinforce, a custom loss, a critic, a forward only), adapters of different ranks,
scalings and layers, on the real tiny model.

Tolerance: float32 on the CPU, where only the order of float additions differs (one GEMM over every model's rows
instead of one per model): tests/tolerances.py's bound for the tiny model's chain of sums, twice for a gradient (3e-4
of each tensor's largest magnitude, plus 3e-4 relative; measured: 2e-6 and ~4e-6 on two machines, 6e-5 on a third of
the same kind), still far below any real error (a wrong row or adapter moves a gradient by O(1) of its scale).
The weights after Adam steps are compared as a whole: Adam divides each gradient entry by its own running magnitude,
so an entry that is a near-cancelling sum (a large relative rounding error) moves its weight by up to the learning
rate whatever its size, and no per-entry bound holds (measured: one entry of 1024 off by 8.7e-4 of the tensor's
largest magnitude). The difference's norm is held within 1e-3 of how far the steps moved the weights (measured 5.6e-5;
a wrong gradient moves it by O(1)).
A model's requests replayed as they ran in their mixed passes (what a rebuild does) equal the originals exactly.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from app.errors import NotFound, TinkerServeError
from app.messages import AdamParams, AdapterSpec, ForwardBackwardArgs, ShardOutput
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from app.training_data.custom_losses import CustomLossProgram
from app.training_data.losses import SAMPLED_MASK, SAMPLER_LOGPROBS, resolve_config
from tests.conftest import TINY_MODEL
from tests.tolerances import assert_sums_close, network_terms, sum_tolerance
from tests.unit.training.custom_loss_graphs import clipped_pg, program
from tests.unit.training.test_engine import make_batch

TERMS = network_terms(TINY_MODEL)  # a forward pass's chain of sums; a gradient's is twice as long
WEIGHT_RTOL = 1e-3  # of how far the optimizer steps moved the weights, in norm (module docstring)
ADAM = AdamParams(learning_rate=1e-2)


def _policy_batch(lengths: list[int], seed: int) -> PackedBatch:
    batch = make_batch(lengths, seed=seed)
    rng = np.random.default_rng(seed + 100)
    n = len(batch.tokens)
    extra = {
        "logprobs": rng.uniform(-9.0, -6.0, n).astype(np.float32),
        "old_logprobs": rng.uniform(-9.0, -6.0, n).astype(np.float32),
        "advantages": rng.normal(0.0, 1.0, n).astype(np.float32),
        SAMPLER_LOGPROBS: rng.uniform(-9.0, -6.0, n).astype(np.float32),
        SAMPLED_MASK: np.ones(n, np.float32),
    }
    return PackedBatch(batch.tokens, batch.offsets, {**batch.loss_inputs, **extra})


def _critic_batch(lengths: list[int], seed: int) -> PackedBatch:
    batch = make_batch(lengths, seed=seed)
    rng = np.random.default_rng(seed + 200)
    n = len(batch.tokens)
    inputs = {"values": rng.normal(0, 0.1, n).astype(np.float32), "returns": rng.normal(0, 1, n).astype(np.float32)}
    return PackedBatch(batch.tokens, batch.offsets, inputs)


def _args(
    loss_fn: str, batch: PackedBatch, forward_only: bool = False, custom: CustomLossProgram | None = None
) -> ForwardBackwardArgs:
    config = {} if custom is not None else resolve_config(loss_fn, {})
    return ForwardBackwardArgs(loss_fn, config, forward_only, batch, custom)


REQUESTS: list[tuple[str, AdapterSpec, ForwardBackwardArgs]] = [
    ("ce", AdapterSpec(rank=8, seed=1), _args("cross_entropy", make_batch([7, 12, 3], seed=1))),
    ("ppo", AdapterSpec(rank=4, seed=2), _args("ppo", _policy_batch([9, 5], seed=2))),
    ("is", AdapterSpec(rank=8, seed=3), _args("importance_sampling", _policy_batch([4, 11, 6, 2], seed=3))),
    ("stable", AdapterSpec(rank=8, seed=4), _args("stable_reinforce", _policy_batch([8, 8], seed=4))),
    (
        "custom",
        AdapterSpec(rank=8, seed=5),
        _args(
            "custom",
            _policy_batch([10, 3], seed=5),
            custom=program(clipped_pg, {"logprobs": 1, "advantages": 1, "old_logprobs": 1}),
        ),
    ),
    ("critic", AdapterSpec(rank=8, seed=6, role="critic"), _args("ppo_critic", _critic_batch([6, 9], seed=6))),
    ("looker", AdapterSpec(rank=8, seed=7), _args("cross_entropy", make_batch([5, 13], seed=7), forward_only=True)),
    # attention only, another alpha: no delta on the MLP layers, another scaling
    ("attn", AdapterSpec(rank=8, seed=8, train_mlp=False, alpha=8.0), _args("cross_entropy", make_batch([5], seed=8))),
]


def _engine(micro_batch_tokens: int = 16384) -> TrainingEngine:
    engine = TrainingEngine(load_base_model(str(TINY_MODEL)), micro_batch_tokens=micro_batch_tokens)
    for model_id, spec, _ in REQUESTS:
        engine.create_model(model_id, spec)
    return engine


def _assert_steps_close(got: torch.Tensor, want: torch.Tensor, before: torch.Tensor) -> None:
    """Weights after the same optimizer steps from `before`: apart by a sliver of how far the steps moved them."""
    moved, apart = float((want - before).norm()), float((got - want).norm())
    assert apart <= WEIGHT_RTOL * moved, f"{apart:.3e} apart after steps that moved the weights by {moved:.3e}"


def _grads(engine: TrainingEngine, model_id: str) -> list[torch.Tensor | None]:
    return [None if p.grad is None else p.grad.clone() for p in engine.loaded(model_id).params]


def _assert_same_answer(mixed: ShardOutput | TinkerServeError, alone: ShardOutput | TinkerServeError) -> None:
    assert isinstance(mixed, ShardOutput) and isinstance(alone, ShardOutput)
    np.testing.assert_array_equal(mixed.datum_indices, alone.datum_indices)
    assert mixed.outputs.keys() == alone.outputs.keys()
    for name in alone.outputs:
        assert_sums_close(mixed.outputs[name], alone.outputs[name], TERMS, err_msg=name)
    # the loss and the stats: float32 sums over the tokens (held as Python floats), of terms as large as the tokens'
    terms = TERMS + max(values.size for values in alone.outputs.values())
    losses = alone.outputs.get("elementwise_loss")
    magnitude = abs(alone.loss_sum) if losses is None else float(np.abs(losses).sum())
    assert mixed.loss_sum == sum_tolerance(np.float32, terms, magnitude).approx(alone.loss_sum)
    assert mixed.stats.keys() == alone.stats.keys()
    for name, (total, count) in alone.stats.items():
        assert mixed.stats[name][0] == sum_tolerance(np.float32, terms, abs(total)).approx(total), name
        assert mixed.stats[name][1] == count
    assert mixed.loss_cost_tokens == alone.loss_cost_tokens


@pytest.fixture(scope="module")
def engines() -> tuple[TrainingEngine, TrainingEngine]:
    return _engine(), _engine()


def test_one_pass_of_many_models_equals_them_one_after_another(engines) -> None:  # type: ignore[no-untyped-def]
    mixed, alone = engines
    requests = [(model_id, args) for model_id, _, args in REQUESTS]
    assert mixed.mix(requests)
    initial = {model_id: alone.adapter_state(model_id) for model_id, _, _ in REQUESTS}
    for _ in range(2):  # the second step starts from trained adapters and accumulated optimizer state
        together = mixed.forward_backward_many(requests)
        apart = [alone.forward_backward_many([request])[0] for request in requests]
        for (model_id, _, args), got, want in zip(REQUESTS, together, apart, strict=True):
            _assert_same_answer(got, want)
            got_grads, want_grads = _grads(mixed, model_id), _grads(alone, model_id)
            if args.forward_only:
                assert all(g is None for g in got_grads + want_grads)
                continue
            assert max(float(w.abs().max()) for w in want_grads if w is not None) > 0  # it learns something
            for g, w in zip(got_grads, want_grads, strict=True):
                assert g is not None and w is not None
                assert_sums_close(g, w, 2 * TERMS)
        for model_id, _, args in REQUESTS:
            if not args.forward_only:
                mixed.optim_step(model_id, ADAM)
                alone.optim_step(model_id, ADAM)
    for model_id, _, _ in REQUESTS:
        for name, weight in alone.adapter_state(model_id).items():
            _assert_steps_close(mixed.adapter_state(model_id)[name], weight, initial[model_id][name])


def test_a_replay_of_each_model_equals_its_mixed_passes_bit_for_bit() -> None:
    """A rebuild replays one model at a time, each of its mixed passes with stand-ins for the other models: its
    outputs, gradients and weights after two steps equal the original pass's exactly (not within a tolerance)."""
    mixed, replayed = _engine(), _engine()
    requests = [(model_id, args) for model_id, _, args in REQUESTS]
    steps: list[list[ShardOutput | TinkerServeError]] = []
    for _ in range(2):
        steps.append(mixed.forward_backward_many(requests))
        for model_id, _, args in REQUESTS:
            if not args.forward_only:
                mixed.optim_step(model_id, ADAM)
    for i, (model_id, _, args) in enumerate(REQUESTS):
        if args.forward_only:
            continue
        for answers in steps:
            original = answers[i]
            assert isinstance(original, ShardOutput) and original.layout is not None
            again = replayed.replay(model_id, args, original.layout)
            for name, values in original.outputs.items():
                np.testing.assert_array_equal(again.outputs[name], values)
            replayed.optim_step(model_id, ADAM)
        for name, weight in mixed.adapter_state(model_id).items():
            assert torch.equal(replayed.adapter_state(model_id)[name], weight), (model_id, name)
    assert sorted(replayed._models) == sorted(m for m, _, _ in REQUESTS)  # the stand-ins are gone


def test_a_failed_request_fails_alone_and_keeps_no_gradient(engines) -> None:  # type: ignore[no-untyped-def]
    mixed, alone = engines
    good = _policy_batch([6, 4], seed=9)
    wrong = np.zeros((len(good.tokens), 3), np.float32)  # advantages of the wrong shape: the loss fails on the worker
    broken = PackedBatch(good.tokens, good.offsets, {**good.loss_inputs, "advantages": wrong})
    requests = [
        ("ce", REQUESTS[0][2]),
        ("is", _args("importance_sampling", broken)),
        ("nobody", REQUESTS[0][2]),
        ("critic", REQUESTS[5][2]),
    ]
    before = _grads(mixed, "is")
    answers = mixed.forward_backward_many(requests)
    assert isinstance(answers[1], TinkerServeError) and isinstance(answers[2], NotFound)
    for got, want in zip(before, _grads(mixed, "is"), strict=True):
        # exact: the failed request's gradient is dropped, so no arithmetic touched these
        assert (got is None and want is None) or torch.equal(got, want)  # type: ignore[arg-type]
    _assert_same_answer(answers[0], alone.forward_backward_many([requests[0]])[0])
    _assert_same_answer(answers[3], alone.forward_backward_many([requests[3]])[0])


def test_runs_of_one_rank_and_size_equal_one_after_another(engines) -> None:  # type: ignore[no-untyped-def]
    """Every adapter of one rank on every layer, the same number of rows each: the layers' deltas come from one
    batched product over a view of the input (no padding, no gather)."""
    mixed, alone = engines
    models = ("ce", "is", "stable")  # rank 8 each, every layer
    requests = [(m, _args("cross_entropy", make_batch([6, 9], seed=20 + i))) for i, m in enumerate(models)]
    for got, request in zip(mixed.forward_backward_many(requests), requests, strict=True):
        _assert_same_answer(got, alone.forward_backward_many([request])[0])
    for model_id, _ in requests:
        for g, w in zip(_grads(mixed, model_id), _grads(alone, model_id), strict=True):
            assert g is not None and w is not None
            assert_sums_close(g, w, 2 * TERMS)


def test_requests_mix_only_within_one_micro_batch_and_once_per_model() -> None:
    engine = _engine(micro_batch_tokens=64)
    small = make_batch([8, 8], seed=1)
    assert engine.mix([("ce", _args("cross_entropy", small)), ("is", _args("cross_entropy", small))])
    assert not engine.mix([("ce", _args("cross_entropy", small)), ("ce", _args("cross_entropy", small))])
    assert not engine.mix([("ce", _args("cross_entropy", small))])
    big = make_batch([40, 40], seed=2)  # 2 x 40 + 2 x 40 padded tokens > 64
    assert not engine.mix([("ce", _args("cross_entropy", big)), ("is", _args("cross_entropy", big))])
