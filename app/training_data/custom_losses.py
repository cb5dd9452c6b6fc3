"""A custom loss as the SDK traces it (`tinker.types.CustomLossGraph`), checked node by node against the allow-list
(app.training_data.custom_loss_ops) before it is stored. No torch here: the ingress runs this.

Nothing in a graph is ever unpickled, evaluated or executed here; the workers' interpreter
(app.training.custom_loss.interpreter) later runs only what passed, binding each allowed name to its callable.
Every rejection is a user error naming the node (`graph.nodes[i]`) or the input (`inputs[i]`); integers are bounded
(limits.max_custom_loss_integer) and arithmetic takes tensors and numbers only (app.training_data.custom_loss_operands).
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Collection
from dataclasses import dataclass, replace
from typing import Any

from app.config import LimitsConfig
from app.errors import LimitExceeded, UserError
from app.training_data.custom_loss_nodes import LossNode
from app.training_data.custom_loss_operands import Kind, check_operands, kind
from app.training_data.custom_loss_ops import DTYPES, FUNCTIONS, GETATTR_ATTRIBUTES, HOST_METHODS, METHODS

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
_INPUT_NAME = re.compile(r"[a-z_][a-z0-9_]{0,63}")
_METRIC_KEY = re.compile(r"custom/[a-z0-9_./-]{1,64}:(sum|mean)")
_MAX_INPUTS = 16
_MAX_DEPTH = 8
_MAX_STRING = 256
_MAX_ITEMS = 64  # a node's arguments, and any list, tuple or dict among them (metrics included)
_CONSTANTS = {
    "float": frozenset({"inf", "-inf", "nan"}),
    "dtype": DTYPES,
    "layout": frozenset({"strided"}),
    "memory_format": frozenset({"contiguous_format", "preserve_format"}),
}


@dataclass(frozen=True)
class CustomLossProgram:
    """A validated custom loss: its inputs (logprobs first) with their ranks, and its nodes in order."""

    loss_id: str
    name: str
    inputs: tuple[tuple[str, int], ...]
    nodes: tuple[LossNode, ...]
    # limits.max_custom_loss_elements, max_custom_loss_flops_per_request, max_custom_loss_integer and
    # max_custom_loss_seconds (their defaults), set when the ingress resolves the loss (`under`; not stored)
    max_elements: int = 2**24
    max_flops: int = 2**40
    max_integer: int = 2**53
    max_seconds: float = 30.0

    def under(self, limits: LimitsConfig) -> CustomLossProgram:
        """The loss as it runs under these limits."""
        return replace(
            self,
            max_elements=limits.max_custom_loss_elements,
            max_flops=limits.max_custom_loss_flops_per_request,
            max_integer=limits.max_custom_loss_integer,
            max_seconds=limits.max_custom_loss_seconds,
        )

    @property
    def input_names(self) -> tuple[str, ...]:
        """The loss_fn_inputs keys the loss reads (after logprobs)."""
        return tuple(name for name, _ in self.inputs[1:])

    def to_json(self) -> str:
        nodes = [[n.op, n.name, n.target, n.args, n.kwargs] for n in self.nodes]
        return json.dumps({"name": self.name, "inputs": self.inputs, "nodes": nodes})

    @classmethod
    def from_json(cls, loss_id: str, text: str) -> CustomLossProgram:
        obj = json.loads(text)
        nodes = tuple(LossNode(*n) for n in obj["nodes"])
        return cls(loss_id, obj["name"], tuple((n, int(r)) for n, r in obj["inputs"]), nodes)


def validate_custom_loss(
    loss_id: str, name: str, inputs: list[Any], graph: Any, max_nodes: int, max_integer: int = 2**53
) -> CustomLossProgram:
    """The program of a create_custom_loss request, or a user error naming what is not allowed; `max_integer` is
    limits.max_custom_loss_integer."""
    if not isinstance(name, str) or not 0 < len(name) <= 128:
        raise UserError("name must be a string of 1 to 128 characters", field="name")
    declared = _inputs(inputs)
    if not isinstance(graph, dict) or graph.get("format", 1) != 1 or not isinstance(graph.get("nodes"), list):
        raise UserError("graph must be a CustomLossGraph of format 1 with a list of nodes", field="graph")
    raw = graph["nodes"]
    if len(raw) > max_nodes:
        raise LimitExceeded(
            f"graph has {len(raw)} nodes; limits.max_custom_loss_nodes is {max_nodes}", field="graph.nodes"
        )
    kinds: dict[str, Kind] = {}  # what each node gives, as far as the graph says
    nodes = []
    for i, obj in enumerate(raw):
        node = _node(i, obj, kinds.keys(), max_integer)
        field = f"graph.nodes[{i}]"
        if i < len(declared):
            if node.op != "placeholder" or node.target != declared[i][0]:
                raise UserError(
                    f"{field} must be the placeholder of input {declared[i][0]!r} (inputs in order)", field=field
                )
        elif node.op == "placeholder":
            raise UserError(f"{field} ({node.name!r}) is a placeholder no input declares", field=field)
        elif i == len(raw) - 1:
            if node.op != "output":
                raise UserError(f"{field} ({node.name!r}): the last node must be the output", field=field)
            _check_output(field, node)
        else:
            _check_call(field, node, kinds)
        kinds[node.name] = kind(node, kinds)
        nodes.append(node)
    if len(nodes) <= len(declared):
        raise UserError("graph has no operations and no output", field="graph.nodes")
    return CustomLossProgram(loss_id, name, declared, tuple(nodes))


def _inputs(inputs: list[Any]) -> tuple[tuple[str, int], ...]:
    if not isinstance(inputs, list) or not 0 < len(inputs) <= _MAX_INPUTS:
        raise UserError(f"inputs must list 1 to {_MAX_INPUTS} inputs, logprobs first", field="inputs")
    out: list[tuple[str, int]] = []
    for i, item in enumerate(inputs):
        field = f"inputs[{i}]"
        name, rank = (item.get("name"), item.get("rank")) if isinstance(item, dict) else (None, None)
        if not isinstance(name, str) or not _INPUT_NAME.fullmatch(name) or name in dict(out):
            raise UserError(f"{field}.name must be a new lowercase identifier, got {name!r}", field=f"{field}.name")
        if (i == 0) != (name == "logprobs"):
            raise UserError(f"{field}: logprobs must be the first input, and only the first", field=f"{field}.name")
        if rank not in (1, 2) or isinstance(rank, bool):
            why = "per-token inputs only: rank 1 ([T]) or 2 ([T, K])" if rank == 0 else "rank 1 or 2"
            raise UserError(f"{field} {name!r} has rank {rank!r}; this server takes {why}", field=f"{field}.rank")
        out.append((name, rank))
    return tuple(out)


def _node(i: int, obj: Any, seen: Collection[str], max_integer: int) -> LossNode:
    field = f"graph.nodes[{i}]"
    if not isinstance(obj, dict):
        raise UserError(f"{field} must be an object", field=field)
    op, name, target = obj.get("op"), obj.get("name"), obj.get("target")
    args, kwargs = obj.get("args") or [], obj.get("kwargs") or {}
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name in seen:
        raise UserError(f"{field}.name must be a new identifier, got {name!r}", field=f"{field}.name")
    if op == "get_attr":
        raise UserError(f"{field} ({name!r}) captures a tensor; a loss reads only its inputs", field=field)
    if op == "call_module":
        raise UserError(f"{field} ({name!r}) calls a torch.nn module; use functions instead", field=field)
    if op not in ("placeholder", "call_function", "call_method", "output"):
        raise UserError(f"{field} ({name!r}) has unknown op {op!r}", field=f"{field}.op")
    if not isinstance(target, str) or not isinstance(args, list) or not isinstance(kwargs, dict):
        raise UserError(f"{field} ({name!r}) needs a string target, a list args and an object kwargs", field=field)
    for part, items in (("args", args), ("kwargs", kwargs)):
        _check_length(f"{field} ({name!r}) {part}", f"{field}.{part}", items)
    for key, value in [*enumerate(args), *kwargs.items()]:
        part = "args" if isinstance(key, int) else "kwargs"
        _check_arg(f"{field} ({name!r}) argument {key!r}", f"{field}.{part}", value, seen, max_integer)
    if "out" in kwargs:
        raise UserError(f"{field} ({name!r}) writes into a tensor (out=); return new values instead", field=field)
    return LossNode(op, name, target, args, kwargs)


def _check_arg(where: str, field: str, value: Any, seen: Collection[str], max_integer: int, depth: int = 0) -> None:
    """An encoded argument (of `field`): scalars, lists, and the SDK's one-key objects; a ref names an earlier
    node."""
    if depth > _MAX_DEPTH:
        raise UserError(f"{where} nests deeper than {_MAX_DEPTH}", field="graph")
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if abs(value) > max_integer:
            raise LimitExceeded(
                f"{where} is an integer of {value.bit_length()} bits; limits.max_custom_loss_integer is "
                f"{max_integer} (2^{math.log2(max_integer):.4g})",
                field=field,
            )
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise UserError(f"{where} is not a finite number", field="graph")
        return
    if isinstance(value, str):
        if len(value) > _MAX_STRING:
            raise UserError(f"{where} is a string over {_MAX_STRING} characters", field="graph")
        return
    if isinstance(value, list):
        _check_length(where, field, value)
        for item in value:
            _check_arg(where, field, item, seen, max_integer, depth + 1)
        return
    if not (isinstance(value, dict) and len(value) == 1):
        raise UserError(f"{where} is not an encoded argument: {str(value)[:80]}", field="graph")
    ((kind, inner),) = value.items()
    if kind == "ref":
        if inner not in seen:
            raise UserError(f"{where} refers to {inner!r}, which is not an earlier node", field="graph")
    elif kind in ("tuple", "slice") and isinstance(inner, list) and (kind == "tuple" or len(inner) == 3):
        _check_length(where, field, inner)
        for item in inner:
            _check_arg(where, field, item, seen, max_integer, depth + 1)
    elif kind == "dict" and isinstance(inner, dict):
        _check_length(where, field, inner)
        for item in inner.values():
            _check_arg(where, field, item, seen, max_integer, depth + 1)
    elif (kind == "ellipsis" and inner is True) or (kind == "device" and isinstance(inner, str)):
        return  # a device always means the worker's own
    elif kind not in _CONSTANTS or inner not in _CONSTANTS[kind]:
        raise UserError(f"{where} holds {kind} {str(inner)[:40]!r}, which a loss cannot use", field="graph")


def _check_length(where: str, field: str, items: list[Any] | dict[str, Any]) -> None:
    if len(items) > _MAX_ITEMS:
        raise LimitExceeded(
            f"{where} holds {len(items)} items; a list, tuple or dict in a loss holds at most {_MAX_ITEMS}", field=field
        )


def _check_call(field: str, node: LossNode, kinds: dict[str, Kind]) -> None:
    if node.op == "call_function":
        arity = FUNCTIONS.get(node.target)
        what = node.target
    else:
        if node.target in HOST_METHODS:
            raise UserError(
                f"{field} ({node.name!r}) calls {node.target}(), a host-side call that leaves torch or autograd; "
                "keep every value a tensor and return the loss (the server runs backward)",
                field=field,
            )
        arity = METHODS.get(node.target)
        what = f"Tensor.{node.target}"
        if not node.args or not (isinstance(node.args[0], dict) and "ref" in node.args[0]):
            raise UserError(f"{field} ({node.name!r}) calls a method on no tensor", field=field)
    if arity is None:
        raise UserError(
            f"{field} ({node.name!r}) calls {what}, which is not an operation custom losses may use here "
            "(in-place, host-side and size-choosing operations are excluded)",
            field=field,
        )
    low, high = arity
    if not low <= len(node.args) <= high:
        raise UserError(
            f"{field} ({node.name!r}) calls {what} with {len(node.args)} positional arguments, not {low} to {high}",
            field=field,
        )
    if node.target == "getattr" and not (isinstance(node.args[1], str) and node.args[1] in GETATTR_ATTRIBUTES):
        raise UserError(f"{field} ({node.name!r}) reads attribute {node.args[1]!r} of a tensor", field=field)
    if node.op == "call_function" and node.target.startswith(("operator.", "math.")):
        check_operands(field, node, kinds)  # tensors and numbers (app.training_data.custom_loss_operands)


def _check_output(field: str, node: LossNode) -> None:
    out = node.args[0] if len(node.args) == 1 else None
    pair = out.get("tuple") if isinstance(out, dict) else out
    if not (isinstance(pair, list) and len(pair) == 2):
        raise UserError(f"{field}: the loss must return (loss, metrics)", field=field)
    loss, metrics = pair
    if not (isinstance(loss, dict) and "ref" in loss):
        raise UserError(f"{field}: the loss must be a tensor computed by the graph", field=field)
    metrics = metrics.get("dict") if isinstance(metrics, dict) else None
    if not isinstance(metrics, dict):
        raise UserError(f"{field}: metrics must be a dict", field=field)
    for key, value in metrics.items():
        if not _METRIC_KEY.fullmatch(key):
            raise UserError(f"{field}: metric {key!r} must be named custom/<name>:sum or :mean", field=field)
        if not (isinstance(value, dict) and "ref" in value):
            raise UserError(f"{field}: metric {key!r} must be a tensor computed by the graph", field=field)
