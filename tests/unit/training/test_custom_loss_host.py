"""A custom loss's plain-number arithmetic is bounded as it runs, and its time on a rank is the last line
(issue 45, #3): what only the data tells (a size read from a shape) or what a loss stored before the creation-time
checks holds is refused before it computes; past limits.max_custom_loss_seconds the step fails as a user error and
the engine goes on serving."""

from __future__ import annotations

import dataclasses
from dataclasses import replace
from typing import Any

import numpy as np
import pytest
import torch

from app.errors import LimitExceeded, UserError
from app.messages import AdapterSpec
from app.training.base_model import load_base_model
from app.training.custom_loss.interpreter import run_custom_loss
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from app.training_data.custom_loss_nodes import LossNode
from app.training_data.custom_losses import CustomLossProgram, validate_custom_loss
from tests.conftest import TINY_MODEL
from tests.unit.training.custom_loss_graphs import program, request

RANKS = {"logprobs": 1, "weights": 1}


def _weighted(logprobs, weights):  # type: ignore[no-untyped-def]
    return -(logprobs * weights).sum(), {"custom/w:sum": weights.sum()}


def _with(nodes: list[dict[str, Any]], validated: bool = True) -> CustomLossProgram:
    """The weighted loss with these call_function nodes before its output: validated as create_custom_loss does, or
    built as a loss stored before its checks (`validated=False`)."""
    body = request(_weighted, RANKS)
    graph = body["graph"]["nodes"]
    graph[-1:-1] = [{"op": "call_function", "kwargs": {}, **n} for n in nodes]
    if validated:
        return validate_custom_loss("s:loss:0", body["name"], body["inputs"], body["graph"], 512)
    loss = program(_weighted, RANKS)
    return replace(loss, nodes=tuple(LossNode(n["op"], n["name"], n["target"], n["args"], n["kwargs"]) for n in graph))


def _run(loss: CustomLossProgram, tokens: int = 7) -> None:
    run_custom_loss(loss, -torch.rand(tokens), {"weights": torch.ones(tokens)}, np.array([0, tokens]))


SIZE = [
    {"name": "shape", "target": "getattr", "args": [{"ref": "logprobs"}, "shape"]},
    {"name": "n", "target": "operator.getitem", "args": [{"ref": "shape"}, 0]},
]


def test_a_power_of_a_size_is_refused_before_it_computes() -> None:
    loss = _with([*SIZE, {"name": "huge", "target": "operator.pow", "args": [{"ref": "n"}, 10**5]}])
    with pytest.raises(LimitExceeded, match=r"'huge'.*would compute an integer past limits\.max_custom_loss_integer"):
        _run(loss)
    _run(_with([*SIZE, {"name": "square", "target": "operator.pow", "args": [{"ref": "n"}, 2]}]))  # a real one


def test_a_product_of_sizes_past_the_bound_is_refused_after_it() -> None:
    loss = _with([*SIZE, {"name": "big", "target": "operator.mul", "args": [{"ref": "n"}, 2**52]}])
    with pytest.raises(LimitExceeded, match=r"'big'.*holds an integer of 55 bits; limits\.max_custom_loss_integer"):
        _run(loss)


def test_a_stored_loss_multiplying_a_list_is_refused_as_it_runs() -> None:
    """Stored before create_custom_loss refused it: the workers refuse it before building the list."""
    loss = _with([{"name": "grow", "target": "operator.mul", "args": [[0] * 64, 1000]}], validated=False)
    with pytest.raises(UserError, match=r"'grow'.*takes tensors and numbers; its operand 0 is a list"):
        _run(loss)
    loss = _with([{"name": "boom", "target": "operator.pow", "args": [7, 10**5]}], validated=False)
    with pytest.raises(LimitExceeded, match=r"'boom'.*limits\.max_custom_loss_integer"):
        _run(loss)


def test_a_loss_past_its_seconds_is_a_user_error_naming_the_limit() -> None:
    loss = replace(program(_weighted, RANKS), max_seconds=1e-9)
    with pytest.raises(LimitExceeded, match=r"ran past limits\.max_custom_loss_seconds") as info:
        _run(loss)
    assert info.value.field == "loss_fn_config.loss_id"


@pytest.fixture(scope="module")
def engine() -> TrainingEngine:
    return TrainingEngine(load_base_model(str(TINY_MODEL)))


def _batch() -> PackedBatch:
    rng = np.random.default_rng(0)
    lengths = [5, 9]
    return PackedBatch(
        tokens=rng.integers(3, 2048, sum(lengths), dtype=np.int64),
        offsets=np.array([0, 5, 14], dtype=np.int64),
        loss_inputs={
            "target_tokens": rng.integers(3, 2048, sum(lengths), dtype=np.int64),
            "weights": rng.uniform(0.1, 2.0, sum(lengths)).astype(np.float32),
        },
    )


def test_a_step_past_its_seconds_fails_alone_and_the_engine_goes_on(engine: TrainingEngine) -> None:
    """The rank-side step: the loss out of time fails the operation as a user error, adds no gradient, and the
    next step on the same engine runs as if it had never been sent."""
    engine.create_model("late", AdapterSpec(rank=8, seed=1))
    loss, batch = program(_weighted, RANKS), _batch()
    params = engine.loaded("late").params
    with pytest.raises(LimitExceeded, match=r"limits\.max_custom_loss_seconds"):
        engine.forward_backward("late", "custom", {}, batch, False, dataclasses.replace(loss, max_seconds=1e-9))
    assert all(p.grad is None for p in params)
    out = engine.forward_backward("late", "custom", {}, batch, False, loss)
    assert out.stats["custom/w:sum"][0] == pytest.approx(float(batch.loss_inputs["weights"].sum()), rel=1e-5)
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params)
