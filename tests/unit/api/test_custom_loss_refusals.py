"""create_custom_loss refuses, naming the node, what would make the workers compute plain Python values without
bound (a power of constants, a list or string times 10**8, a huge literal) or what the journal cannot hold; a
forward_backward naming a stored loss the journal cannot hold fails its own future and leaves no gap in the model's
order (issue 45, #3 and #12)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import insert

from app.db.metadata import TrainingRun, model_id_for
from app.db.outcomes import Failed
from app.db.schema import custom_losses
from app.messages import Skip
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session
from tests.unit.training.custom_loss_graphs import request

URL = "/api/v1/create_custom_loss"


def _weighted(logprobs, weights):  # type: ignore[no-untyped-def]
    return -(logprobs * weights).sum(), {}


def _body(session_id: str, node: dict[str, Any] | None = None, seq: int = 0) -> tuple[dict[str, Any], int]:
    """A create_custom_loss body of a real traced loss, with `node` inserted before its output; and its index."""
    body = request(_weighted, {"logprobs": 1, "weights": 1})
    nodes = body["graph"]["nodes"]
    if node is not None:
        nodes.insert(len(nodes) - 1, {"op": "call_function", "kwargs": {}, **node})
    return {"session_id": session_id, "custom_loss_seq_id": seq, **body}, len(nodes) - 2


def _refused(api: InProcessApi, node: dict[str, Any], says: str, field_suffix: str = "") -> None:
    body, index = _body(new_session(api), node)
    response = api.post(URL, body)
    assert response.status_code == 400, response.text
    error = response.json()
    assert error["field"] == f"graph.nodes[{index}]{field_suffix}", error
    assert says in error["error"] and repr(node["name"]) in error["error"], error


def test_a_power_of_constants_is_refused_at_creation(api: InProcessApi) -> None:
    node = {"name": "boom", "target": "operator.pow", "args": [7, 10**9]}
    _refused(api, node, "has only constant operands")


def test_a_list_or_string_times_a_number_is_refused_at_creation(api: InProcessApi) -> None:
    for operand, says in (([0] * 64, "operand 0 is a list"), ("ab" * 64, "operand 0 is a string")):
        node = {"name": "grow", "target": "operator.mul", "args": [operand, 10**8]}
        _refused(api, node, says)
    node = {"name": "grow", "target": "operator.mul", "args": [{"tuple": [0, 1]}, {"ref": "logprobs"}]}
    _refused(api, node, "operand 0 is a tuple")


def test_a_shape_times_a_number_is_refused_at_creation(api: InProcessApi) -> None:
    body, _ = _body(new_session(api), {"name": "shape", "target": "getattr", "args": [{"ref": "logprobs"}, "shape"]})
    nodes = body["graph"]["nodes"]
    nodes.insert(len(nodes) - 1, {"op": "call_function", "name": "grow", "target": "operator.mul", "kwargs": {}})
    nodes[-2]["args"] = [{"ref": "shape"}, 10**8]
    response = api.post(URL, body)
    assert response.status_code == 400, response.text
    assert response.json()["field"] == f"graph.nodes[{len(nodes) - 2}]"
    assert "'grow') operator.mul takes tensors and numbers; its operand 0 is a shape" in response.json()["error"]


def test_a_huge_integer_literal_is_refused_at_creation_naming_the_limit(api: InProcessApi) -> None:
    node = {"name": "big", "target": "operator.mul", "args": [{"ref": "logprobs"}, 2**70]}
    _refused(api, node, "limits.max_custom_loss_integer", ".args")


def test_a_loss_the_journal_cannot_hold_is_refused_at_creation(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_custom_loss_integer=2**80)  # the integer bound allows it; the journal's 64 bits do not
    node = {"name": "big", "target": "operator.mul", "args": [{"ref": "logprobs"}, 2**70]}
    _refused(api, node, "cannot be journaled")


class _Trainers:
    """What the trainers were handed (the route's only call to them here)."""

    def __init__(self) -> None:
        self.submitted: list[tuple[str, int, Any]] = []

    def submit(self, trainer: str, model_id: str, seq_id: int, op: Any, user: str) -> None:
        self.submitted.append((model_id, seq_id, op))


def test_a_stored_loss_the_journal_cannot_hold_fails_its_step_without_a_gap(api: InProcessApi) -> None:
    """A loss with 2**70 stored before creation refused it: its forward_backward's future fails with a user error
    and the trainer is told to skip the seq_id, so the model's later operations do not wait out the gap."""
    session_id = new_session(api)
    model_id = model_id_for(session_id, 0)
    lora = {"rank": 4, "seed": 1, "train_attn": True, "train_mlp": True, "optimizer": "adamw"}
    run = TrainingRun(model_id, session_id, BASE_MODEL, 4, "policy", BASE_MODEL, lora, {}, time.time(), True)
    api.run(api.services.metadata.add_training_run(run))
    body, _ = _body(session_id, {"name": "big", "target": "operator.mul", "args": [{"ref": "logprobs"}, 2**70]})
    nodes = [[n["op"], n["name"], n["target"], n["args"], n["kwargs"]] for n in body["graph"]["nodes"]]
    program = json.dumps({"name": body["name"], "inputs": [["logprobs", 1], ["weights", 1]], "nodes": nodes})
    loss_id = f"{session_id}:loss:0"
    row = {"loss_id": loss_id, "session_id": session_id, "name": "old", "program": program, "created_at": 0.0}
    api.run(_insert(api, row))
    trainers = api.services.trainers = _Trainers()  # type: ignore[assignment]

    datum = {
        "model_input": {"chunks": [{"tokens": [5, 6, 7]}]},
        "loss_fn_inputs": {
            "target_tokens": {"data": [6, 7, 8], "dtype": "int64", "shape": [3]},
            "weights": {"data": [1.0, 1.0, 1.0], "dtype": "float32", "shape": [3]},
        },
    }
    fbi = {"loss_fn": "custom", "loss_fn_config": {"loss_id": loss_id}, "data": [datum]}
    response = api.post("/api/v1/forward_backward", {"model_id": model_id, "seq_id": 1, "forward_backward_input": fbi})
    assert response.status_code == 200, response.text
    outcome = api.run(api.services.futures.get(response.json()["request_id"]))
    assert isinstance(outcome, Failed) and outcome.error["category"] == "user", outcome
    assert "cannot be journaled" in outcome.error["error"] and outcome.error["field"] == "loss_fn_config.loss_id"
    assert [(m, s, type(op)) for m, s, op in trainers.submitted] == [(model_id, 1, Skip)]


async def _insert(api: InProcessApi, row: dict[str, Any]) -> None:
    """A row as an earlier release stored it (its checks at creation were fewer)."""
    db = api.services.custom_losses._db
    async with db.begin() as conn:
        await conn.execute(insert(custom_losses).values(row))
