"""The registry of operations (app/operations): every sequenced message has exactly one operation, every operation
declares every member (one that leaves any out does not load), and what each declares about recovery, scheduling,
history, metrics and usage is what the server relies on."""

from __future__ import annotations

from typing import Any, cast

import numpy as np
import pytest

from app.db.checkpoints import CheckpointRecord
from app.messages import AdamParams, ForwardBackwardArgs, SequencedOp, Skip
from app.operations import OPERATIONS, Operation, api_calls, changes_model, fair_share_cost, operation
from app.operations.forward_backward import ForwardBackward
from app.operations.load_checkpoint import LoadCheckpoint
from app.operations.optim_step import OptimStep
from app.operations.save_checkpoint import SaveCheckpoint
from app.operations.save_for_sampler import SaveForSampler
from app.storage.paths import checkpoint_path
from app.training_data.batch import PackedBatch

FIXED = 7  # trainer.fixed_op_cost_tokens


def _batch(tokens: int) -> PackedBatch:
    return PackedBatch(np.arange(tokens, dtype=np.int64), np.array([0, tokens], dtype=np.int64))


def _checkpoint() -> CheckpointRecord:
    path = checkpoint_path("m", "weights", "c")
    return CheckpointRecord(path, path.new_location(), 0, 0.0)


def _all_subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct} | _all_subclasses(direct)}


def test_every_sequenced_message_but_skip_has_one_operation() -> None:
    assert set(OPERATIONS) == _all_subclasses(SequencedOp) - {Skip}
    assert all(isinstance(op, Operation) and type(op).message is message for message, op in OPERATIONS.items())


def test_an_operation_that_leaves_out_a_member_does_not_load() -> None:
    class NoHistory(Operation[SaveForSampler, int]):
        message = SaveForSampler
        calls = ("x",)

        def name(self, op: SaveForSampler) -> str:
            return "x"

    with pytest.raises(TypeError, match="abstract"):
        cast(Any, NoHistory)()  # as the registry would, were it in app/operations
    with pytest.raises(TypeError, match=r"does not declare \['message'\]"):

        class NoMessage(Operation[SaveForSampler, int]):
            calls = ("x",)


# message -> (name, changes the model, counts toward a snapshot, fair-share cost, history (tokens, lr, finishes a
# step) or None, trained tokens, usage tokens)
EXPECTED: list[tuple[SequencedOp, tuple[Any, ...]]] = [
    (
        ForwardBackward("r", ForwardBackwardArgs("cross_entropy", {}, False, _batch(12))),
        ("forward_backward", True, False, 12, (12, None, False), 12, 12),
    ),
    (
        ForwardBackward("r", ForwardBackwardArgs("cross_entropy", {}, True, _batch(5))),
        ("forward", False, False, 5, (5, None, False), 0, 5),
    ),
    (OptimStep("r", AdamParams(learning_rate=0.5)), ("optim_step", True, True, FIXED, (0, 0.5, True), 0, 0)),
    (SaveCheckpoint("r", _checkpoint()), ("save_weights", False, False, FIXED, None, 0, 0)),
    (SaveForSampler("r", "s", "loc"), ("save_weights_for_sampler", False, False, FIXED, None, 0, 0)),
    (LoadCheckpoint("r", "tinker://m/weights/c", "loc", True), ("load_weights", True, True, FIXED, None, 0, 0)),
]


@pytest.mark.parametrize(("op", "expected"), EXPECTED, ids=[f"{type(op).__name__}-{e[0]}" for op, e in EXPECTED])
def test_what_each_operation_declares(op: SequencedOp, expected: tuple[Any, ...]) -> None:
    kind = operation(op)
    history = kind.history(op)
    declared = (
        kind.name(op),
        changes_model(op),
        kind.counts_toward_snapshot(op),
        fair_share_cost(op, FIXED),
        None if history is None else (history.tokens, history.learning_rate, history.finishes_step),
        kind.trained_tokens(op),
        kind.usage_tokens(op),
    )
    assert declared == expected


def test_skips_cost_nothing_and_change_nothing() -> None:
    assert fair_share_cost(Skip("r"), FIXED) == 0 and not changes_model(Skip("r"))


def test_the_api_calls_answering_with_an_operations_future() -> None:
    assert api_calls() == tuple(dict.fromkeys(call for op in OPERATIONS.values() for call in op.calls)) and set(
        api_calls()
    ) == {
        "forward_backward",
        "optim_step",
        "save_weights",
        "save_weights_for_sampler",
        "save_weights_external",
        "load_weights",
    }


def test_every_operations_call_has_its_route() -> None:
    """The API serves every call the registry declares (a new operation without its route fails here)."""
    from fastapi.routing import APIRoute

    from app.api.main import create_api

    posts = {route.path for route in create_api().routes if isinstance(route, APIRoute) and "POST" in route.methods}
    assert {f"/api/v1/{call}" for call in api_calls()} <= posts
