"""Runs a validated custom loss (CustomLossProgram) in torch on the workers, one datum at a time, node by node.

Each allowed name of app.training.custom_loss.ops is bound here to its callable once; a node can call nothing
else. Autograd flows through every node, so the summed loss's backward reaches the model. A loss that fails
on the data (a shape mismatch, a non-scalar loss) is the user's error, naming the node.
"""

from __future__ import annotations

import math
import operator
from typing import Any

import numpy as np
import torch

from app.errors import LimitExceeded, UserError
from app.training.custom_loss.ops import FUNCTIONS
from app.training.custom_loss.program import CustomLossProgram, LossNode

_FIELD = "loss_fn_config.loss_id"
_ROOTS: dict[str, Any] = {"torch": torch, "math": math, "operator": operator}
_FAILURES = (RuntimeError, TypeError, ValueError, IndexError, ZeroDivisionError, OverflowError)


def _bind(qualified: str) -> Any:
    if qualified == "getattr":
        return getattr
    root, *path = qualified.split(".")
    obj = _ROOTS[root]
    for part in path:
        obj = getattr(obj, part)
    return obj


BOUND: dict[str, Any] = {name: _bind(name) for name in FUNCTIONS}


def run_custom_loss(
    program: CustomLossProgram,
    logprobs: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    offsets: np.ndarray,
) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
    """The summed loss over the datums (rows offsets[i]:offsets[i+1]) and each metric as (sum over datums,
    number of datums): `:mean` metrics merge as sum / count, `:sum` metrics as the sum."""
    total = logprobs.new_zeros(())
    sums: dict[str, float] = {}
    num_datums = len(offsets) - 1
    for i in range(num_datums):
        rows = slice(int(offsets[i]), int(offsets[i + 1]))
        args = [logprobs[rows], *(inputs[name][rows] for name in program.input_names)]
        loss, metrics = run_datum(program, args)
        total = total + loss
        for key, value in metrics.items():
            sums[key] = sums.get(key, 0.0) + value
    return total, {key: (value, float(num_datums)) for key, value in sums.items()}


def run_datum(program: CustomLossProgram, args: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
    """One datum's (scalar loss, metrics) from the program's inputs, in order."""
    env: dict[str, Any] = {}
    for node in program.nodes:
        if node.op == "placeholder":
            env[node.name] = args[len(env)]
            continue
        if node.op == "output":
            return _output(program, node, env)
        value = _call(program, node, env)
        if isinstance(value, torch.Tensor) and value.numel() > program.max_elements:
            raise LimitExceeded(
                f"custom loss {program.name!r}: node {node.name!r} computes {value.numel()} elements; "
                f"limits.max_custom_loss_elements is {program.max_elements}",
                field=_FIELD,
            )
        env[node.name] = value
    raise UserError(f"custom loss {program.name!r} has no output", field=_FIELD)  # validation prevents this


def _call(program: CustomLossProgram, node: LossNode, env: dict[str, Any]) -> Any:
    device = next(v for v in env.values() if isinstance(v, torch.Tensor)).device
    args = [_decode(a, env, device) for a in node.args]
    kwargs = {k: _decode(v, env, device) for k, v in node.kwargs.items()}
    where = f"custom loss {program.name!r}, node {node.name!r} ({node.target})"
    if node.op == "call_method" and not isinstance(args[0], torch.Tensor):
        raise UserError(f"{where} calls a tensor method on a {type(args[0]).__name__}", field=_FIELD)
    if node.target.startswith("math.") and any(isinstance(a, torch.Tensor) for a in args):
        raise UserError(f"{where} applies math to a tensor, which leaves autograd; use torch", field=_FIELD)
    try:
        if node.op == "call_method":
            return getattr(args[0], node.target)(*args[1:], **kwargs)
        return BOUND[node.target](*args, **kwargs)
    except _FAILURES as exc:
        raise UserError(f"{where} failed: {exc}", field=_FIELD) from None


def _output(program: CustomLossProgram, node: LossNode, env: dict[str, Any]) -> tuple[torch.Tensor, dict[str, float]]:
    loss, metrics = _decode(node.args[0], env, torch.device("cpu"))
    if not isinstance(loss, torch.Tensor) or loss.ndim != 0:
        shape = tuple(loss.shape) if isinstance(loss, torch.Tensor) else type(loss).__name__
        raise UserError(f"custom loss {program.name!r} must return a scalar loss, got {shape}", field=_FIELD)
    values: dict[str, float] = {}
    for key, value in metrics.items():
        if not isinstance(value, torch.Tensor) or value.numel() != 1:
            raise UserError(f"custom loss {program.name!r}: metric {key!r} must be a scalar tensor", field=_FIELD)
        values[key] = float(value.detach())
    return loss, values


def _decode(value: Any, env: dict[str, Any], device: torch.device) -> Any:
    """An argument as the SDK encoded it (validated: app.training.custom_loss.program)."""
    if isinstance(value, list):
        return [_decode(v, env, device) for v in value]
    if not isinstance(value, dict):
        return value
    ((kind, inner),) = value.items()
    if kind == "ref":
        return env[inner]
    if kind == "tuple":
        return tuple(_decode(v, env, device) for v in inner)
    if kind == "dict":
        return {k: _decode(v, env, device) for k, v in inner.items()}
    if kind == "slice":
        return slice(*(_decode(v, env, device) for v in inner))
    if kind == "ellipsis":
        return Ellipsis
    if kind == "float":
        return float(inner)
    if kind == "device":
        return device  # whatever the client traced on, the loss runs where the model is
    if kind == "layout":
        return torch.strided
    return getattr(torch, inner)  # dtype or memory_format, from the validated sets
