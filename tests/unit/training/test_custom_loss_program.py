"""The create_custom_loss validator: real SDK graphs pass; every rejection is a user error naming the node."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch

from app.errors import LimitExceeded, UserError
from app.training_data.custom_loss_ops import FUNCTIONS, METHODS
from app.training_data.custom_losses import CustomLossProgram, validate_custom_loss
from tests.unit.training.custom_loss_graphs import clipped_pg, request

RANKS = {"logprobs": 1, "advantages": 1, "old_logprobs": 1}


def _validate(body: dict[str, Any], max_nodes: int = 512) -> CustomLossProgram:
    return validate_custom_loss("s:loss:0", body["name"], body["inputs"], body["graph"], max_nodes)


def _node(body: dict[str, Any], name: str) -> dict[str, Any]:
    return next(n for n in body["graph"]["nodes"] if n["name"] == name)


def _rejected(body: dict[str, Any], *, field: str, says: str) -> None:
    with pytest.raises(UserError) as info:
        _validate(body)
    assert info.value.field == field
    assert says in str(info.value)


def test_a_traced_loss_passes_and_round_trips_through_json() -> None:
    program = _validate(request(clipped_pg, RANKS))
    assert program.inputs == (("logprobs", 1), ("advantages", 1), ("old_logprobs", 1))
    assert program.input_names == ("advantages", "old_logprobs")
    assert CustomLossProgram.from_json(program.loss_id, program.to_json()) == program


def test_an_unknown_function_is_rejected_naming_its_node() -> None:
    body = request(clipped_pg, RANKS)
    _node(body, "exp")["target"] = "os.system"
    i = next(i for i, n in enumerate(body["graph"]["nodes"]) if n["name"] == "exp")
    _rejected(body, field=f"graph.nodes[{i}]", says="'exp') calls os.system, which is not an operation")


def test_torch_functions_outside_the_allow_list_are_rejected() -> None:
    for target in ("torch.load", "torch.zeros", "torch.arange", "torch.Tensor.add_", "builtins.eval"):
        body = request(clipped_pg, RANKS)
        _node(body, "exp")["target"] = target
        with pytest.raises(UserError, match="not an operation"):
            _validate(body)


def test_host_side_calls_are_rejected_as_such() -> None:
    for method in ("item", "tolist", "numpy", "backward", "cpu"):
        body = request(clipped_pg, RANKS)
        node = _node(body, "mean")
        node["op"], node["target"] = "call_method", method
        with pytest.raises(UserError, match=f"calls {method}\\(\\), a host-side call") as info:
            _validate(body)
        assert info.value.field.startswith("graph.nodes[")


def test_in_place_methods_and_out_arguments_are_rejected() -> None:
    body = request(clipped_pg, RANKS)
    _node(body, "mean")["target"] = "add_"
    _rejected(body, field="graph.nodes[" + str(_index(body, "mean")) + "]", says="Tensor.add_, which is not")
    body = request(clipped_pg, RANKS)
    _node(body, "exp")["kwargs"] = {"out": {"ref": "logprobs"}}
    _rejected(body, field="graph.nodes[" + str(_index(body, "exp")) + "]", says="out=")


def _index(body: dict[str, Any], name: str) -> int:
    return next(i for i, n in enumerate(body["graph"]["nodes"]) if n["name"] == name)


def test_module_calls_captured_tensors_and_unknown_ops_are_rejected() -> None:
    for op, says in (("call_module", "torch.nn module"), ("get_attr", "captures a tensor"), ("exec", "unknown op")):
        body = request(clipped_pg, RANKS)
        _node(body, "exp")["op"] = op
        with pytest.raises(UserError, match=says):
            _validate(body)


def test_wrong_arity_and_bad_attributes_are_rejected() -> None:
    body = request(clipped_pg, RANKS)
    _node(body, "exp")["args"].append(1.0)
    _rejected(body, field=f"graph.nodes[{_index(body, 'exp')}]", says="torch.exp with 2 positional arguments")
    body = request(clipped_pg, RANKS)
    _node(body, "getattr_1")["args"][1] = "__class__"
    _rejected(body, field=f"graph.nodes[{_index(body, 'getattr_1')}]", says="reads attribute '__class__'")


def test_bad_input_ranks_are_rejected_naming_the_input() -> None:
    for i, rank, says in ((0, 0, "per-token inputs only"), (1, 3, "rank 1 or 2"), (2, 0, "per-token inputs only")):
        body = request(clipped_pg, RANKS)
        body["inputs"][i]["rank"] = rank
        _rejected(body, field=f"inputs[{i}].rank", says=says)


def test_inputs_must_match_the_placeholders() -> None:
    body = request(clipped_pg, RANKS)
    body["inputs"][1], body["inputs"][2] = body["inputs"][2], body["inputs"][1]
    _rejected(body, field="graph.nodes[1]", says="placeholder of input 'old_logprobs'")
    body = request(clipped_pg, RANKS)
    body["inputs"] = body["inputs"][1:]
    _rejected(body, field="inputs[0].name", says="logprobs must be the first input")


def test_references_must_name_earlier_nodes_and_encodings_must_be_known() -> None:
    body = request(clipped_pg, RANKS)
    _node(body, "exp")["args"] = [{"ref": "mean"}]  # a later node
    _rejected(body, field="graph", says="refers to 'mean', which is not an earlier node")
    body = request(clipped_pg, RANKS)
    _node(body, "exp")["args"] = [{"pickle": "gASV..."}]
    _rejected(body, field="graph", says="holds pickle")
    body = request(clipped_pg, RANKS)
    _node(body, "exp")["kwargs"] = {"dtype": {"dtype": "complex128"}}
    _rejected(body, field="graph", says="holds dtype 'complex128'")


def test_the_output_must_be_a_loss_and_custom_metrics() -> None:
    body = request(clipped_pg, RANKS)
    output = body["graph"]["nodes"][-1]
    output["args"][0]["tuple"][1]["dict"]["loss:sum"] = {"ref": "exp"}
    _rejected(body, field=f"graph.nodes[{len(body['graph']['nodes']) - 1}]", says="metric 'loss:sum' must be named")
    body = request(clipped_pg, RANKS)
    body["graph"]["nodes"] = body["graph"]["nodes"][:-1]
    with pytest.raises(UserError, match="the last node must be the output"):
        _validate(body)


def test_graphs_beyond_the_node_limit_are_refused() -> None:
    body = request(clipped_pg, RANKS)
    with pytest.raises(LimitExceeded) as info:
        _validate(body, max_nodes=len(body["graph"]["nodes"]) - 1)
    assert info.value.field == "graph.nodes"


def test_every_allowed_name_binds_in_the_interpreter() -> None:
    from app.training.custom_loss.interpreter import BOUND

    assert BOUND.keys() == FUNCTIONS.keys() and all(callable(f) for f in BOUND.values())
    assert all(hasattr(torch.Tensor, m) for m in METHODS)


def test_validation_does_not_modify_the_request() -> None:
    body = request(clipped_pg, RANKS)
    before = copy.deepcopy(body)
    _validate(body)
    assert body == before
