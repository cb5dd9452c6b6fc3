"""The registry of operations (app/operations): every sequenced message has exactly one operation, every operation
declares every member and trait (one that leaves any out does not load), what each declares about recovery,
scheduling, history, metrics and usage is what the server relies on, and every site that treats operations apart (the
gate's body caps, the OpenAPI document, the futures' JSON views, forward passes' commands) applies what each declares.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import numpy as np
import pytest

from app.api.futures import _JSON_VIEWS
from app.api.gate import body_limit
from app.config import WorkerGroupConfig
from app.db.checkpoints import CheckpointRecord, CheckpointStore
from app.db.futures import PROTO_CONTENT_TYPE
from app.messages import (
    AdamParams,
    AdapterSpec,
    ForwardBackwardArgs,
    OptimStepCommand,
    PingCommand,
    SequencedOp,
    ShardOutput,
    Skip,
    runs_a_pass,
)
from app.operations import (
    OPERATIONS,
    CheckpointCommitter,
    Operation,
    Reply,
    Traits,
    api_calls,
    call_traits,
    changes_model,
    fair_share_cost,
    operation,
)
from app.operations.base import CONTROL
from app.operations.create_model import CreateModel
from app.operations.forward_backward import ForwardBackward
from app.operations.load_checkpoint import LoadCheckpoint
from app.operations.optim_step import OptimStep
from app.operations.save_checkpoint import SaveCheckpoint
from app.operations.save_for_sampler import SaveForSampler
from app.storage.objects import ObjectStorage
from app.storage.paths import checkpoint_path
from app.trainer.mixing import MixPolicy, mixed_message
from app.trainer.pass_sizing import PassSizing
from app.trainer.worker_deaths import blamed, too_large
from app.training_data.batch import PackedBatch
from tests.conftest import run_on_db

FIXED = 7  # trainer.fixed_op_cost_tokens


def _batch(tokens: int) -> PackedBatch:
    return PackedBatch(np.arange(tokens, dtype=np.int64), np.array([0, tokens], dtype=np.int64))


def _checkpoint() -> CheckpointRecord:
    path = checkpoint_path("m", "weights", "c")
    return CheckpointRecord(path, path.new_location(), 0, 0.0)


def _all_subclasses(cls: type) -> set[type]:
    return {sub for direct in cls.__subclasses__() for sub in {direct} | _all_subclasses(direct)}


def test_every_sequenced_message_has_one_operation() -> None:
    """Skip and CreateModel included: nothing asks about an operation outside the registry."""
    assert set(OPERATIONS) == _all_subclasses(SequencedOp) and {Skip, CreateModel} <= set(OPERATIONS)
    assert all(isinstance(op, Operation) and type(op).message is message for message, op in OPERATIONS.items())


def test_an_operation_that_leaves_out_a_member_or_a_trait_does_not_load() -> None:
    class NoHistory(Operation[SaveForSampler, int]):
        message = SaveForSampler
        calls = ("x",)
        traits = CONTROL

        def name(self, op: SaveForSampler) -> str:
            return "x"

    with pytest.raises(TypeError, match="abstract"):
        cast(Any, NoHistory)()  # as the registry would, were it in app/operations
    with pytest.raises(TypeError, match=r"does not declare \['message'\]"):

        class NoMessage(Operation[SaveForSampler, int]):
            calls = ("x",)
            traits = CONTROL

    with pytest.raises(TypeError, match=r"does not declare \['traits'\]"):

        class NoTraits(Operation[SaveForSampler, int]):
            message = SaveForSampler
            calls = ("x",)

    with pytest.raises(TypeError, match="carries_batch"):
        cast(Any, Traits)(json_view=None, openapi_body=None, runs=True)  # no trait has a default


def test_a_command_class_that_leaves_out_forward_pass_does_not_load() -> None:
    with pytest.raises(TypeError, match="does not declare forward_pass"):

        class Hidden(PingCommand):  # a command with no word on whether it runs a forward pass
            pass


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
    (CreateModel("r", AdapterSpec(rank=4, seed=0)), ("create_model", False, False, FIXED, None, 0, 0)),
    (Skip("r"), ("skip", False, False, 0, None, 0, 0)),
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


def test_every_operation_has_a_sample_here() -> None:
    """The trait tests below walk these samples: a new operation adds its own."""
    assert {type(op) for op, _ in EXPECTED} == set(OPERATIONS)


def test_the_api_calls_answering_with_an_operations_future() -> None:
    assert api_calls() == tuple(dict.fromkeys(call for op in OPERATIONS.values() for call in op.calls)) and set(
        api_calls()
    ) == {
        "create_model",
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


def _each_call() -> list[tuple[str, str, Traits]]:
    return [(type(op).__name__, call, op.traits) for op in OPERATIONS.values() for call in op.calls]


def test_each_calls_body_cap_is_what_its_operation_declares() -> None:
    """The gate caps a call carrying training data by limits.max_request_bytes, every other by the control cap."""
    capped = {(name, call): body_limit(f"/api/v1/{call}") for name, call, _ in _each_call()}
    declared = {
        (name, call): "max_request_bytes" if traits.carries_batch else "max_control_request_bytes"
        for name, call, traits in _each_call()
    }
    assert capped == declared


def test_each_calls_json_view_is_what_its_operation_declares() -> None:
    """A future's kind is its call: the JSON sent for its protobuf result is its operation's view."""
    views = {(name, call): _JSON_VIEWS.get(call) for name, call, _ in _each_call()}
    assert views == {(name, call): traits.json_view for name, call, traits in _each_call()}


@pytest.fixture(scope="module")
def openapi() -> dict[str, Any]:
    from app.api.main import create_api
    from app.api.openapi import install
    from app.config import ServerConfig
    from app.docs_reference import EXAMPLE_BASE_MODEL

    api = create_api()
    install(api, ServerConfig(base_models=[EXAMPLE_BASE_MODEL]))
    return api.openapi()


def test_each_calls_openapi_body_and_links_are_what_its_operation_declares(openapi: dict[str, Any]) -> None:
    """A self-decoding route's body is its operation's; every other call's is its route's model, and create_model
    links its model_id into each of those that requires one. Every call's future links to retrieve_future."""
    paths, models = openapi["paths"], openapi["components"]["schemas"]
    model_links = paths["/api/v1/create_model"]["post"]["responses"]["200"]["links"]
    for name, call, traits in _each_call():
        route = paths[f"/api/v1/{call}"]["post"]
        body = route.get("requestBody", {})
        where = f"{name}'s {call}"
        if traits.openapi_body is not None:
            assert body == traits.openapi_body, where
            continue
        ref = body.get("content", {}).get("application/json", {}).get("schema", {}).get("$ref")
        assert ref is not None, f"{where}: its route reads no model; one that decodes its body declares openapi_body"
        required = "model_id" in models[ref.rpartition("/")[2]].get("required", [])
        assert (route["operationId"] in model_links) == required, where
        assert {"retrieve_future", "cancel_future"} <= {
            link["operationId"].partition("_api_v1")[0] for link in route["responses"]["200"]["links"].values()
        }, where


def test_operations_sharing_a_call_declare_the_same_traits() -> None:
    assert call_traits()["save_weights_for_sampler"] == operation(SaveForSampler("r", "s", "l")).traits
    from app.operations import _traits_by_call

    heavy = type("Heavy", (), {"calls": ("save_weights",), "traits": replace(CONTROL, carries_batch=True)})()
    with pytest.raises(TypeError, match="the operations answering save_weights declare different traits"):
        _traits_by_call({**OPERATIONS, object: heavy})


def test_a_forward_pass_is_declared_by_its_operation_and_its_command() -> None:
    """What an operation's `forward` says is what its command's class declares (the ranks see only commands), and a
    forward pass carries its batch (so the gate lets it in). A Skip runs nothing."""
    for op, _ in EXPECTED:
        kind = operation(op)
        forward = kind.forward(op)
        if not kind.traits.runs:
            assert forward is None and isinstance(op, Skip)
            continue
        command, name = kind.command("m", op), type(op).__name__
        assert runs_a_pass(command) == (forward is not None), f"{name}: its command's forward_pass is not its forward"
        if forward is not None:
            assert kind.traits.carries_batch, f"{name} runs a forward pass over a batch: it declares carries_batch"
            assert forward is cast(Any, command).args, name


def test_the_trainer_treats_apart_the_forward_passes_its_operations_declare() -> None:
    """A declared forward pass mixes with another model's (app.trainer.mixing), goes first in a mixed message, is
    blamed for a death of the workers before what ran beside it, and is given up with its size and what to change
    (app.trainer.worker_deaths); any other operation none of these."""
    shape = WorkerGroupConfig(mixed_pass_models=2, micro_batch_tokens=256)
    mixes, sizing = MixPolicy(shape, world_size=1), PassSizing.of(shape, 1, None)
    other = ForwardBackward("o", ForwardBackwardArgs("cross_entropy", {}, False, _batch(4)))
    step = OptimStepCommand("m", AdamParams(), request_id="step")
    for op, _ in EXPECTED:
        kind, name = operation(op), type(op).__name__
        forward = kind.forward(op) is not None
        assert mixes([op, other]) == forward, name
        assert ("To fit:" in too_large(op, 2, sizing).message) == forward, name
        if kind.traits.runs:
            command = replace(kind.command("m", op), request_id="it")
            assert blamed([command, step], {"it", "step"}) == (["it"] if forward else ["it", "step"]), name
            theirs = kind.command("o", op)
            message, _ = mixed_message([[command, step], [theirs]])  # mixed: both passes first, then the step
            assert message == ([command, theirs, step] if forward else [command, step, theirs]), name


def _per_rank(op: SequencedOp) -> list[Any]:
    """Each of two ranks' successful answer to `op`'s command."""
    if isinstance(op, ForwardBackward):
        return [ShardOutput(np.array([0]), np.array([0, op.args.batch.num_tokens]), {}, 1.5)] * 2
    return {OptimStep: [{"loss": 1.0}] * 2, SaveCheckpoint: [5, 0], SaveForSampler: [5, 0]}.get(type(op), [None] * 2)


def test_a_protobuf_result_has_its_json_view(tmp_path: Path) -> None:
    """An operation whose reply is protobuf declares the view that JSON-reading SDKs get, and one whose reply is JSON
    declares none."""
    storage = ObjectStorage(str(tmp_path / "blobs"))

    async def replies(db: Any) -> list[tuple[SequencedOp, Reply]]:
        committer = CheckpointCommitter(CheckpointStore(db), storage)
        ran = [op for op, _ in EXPECTED if operation(op).traits.runs]
        return [(op, await operation(op).reply("m", op, _per_rank(op), committer)) for op in ran]

    for op, reply in run_on_db(tmp_path / "db.sqlite", replies):
        view = operation(op).traits.json_view
        proto = reply.content_type == PROTO_CONTENT_TYPE
        assert proto == (view is not None), f"{type(op).__name__}: protobuf results {proto}, a json_view {view}"
        assert view is None or json.dumps(view(reply.payload))
