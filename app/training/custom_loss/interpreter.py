"""Runs a validated custom loss (CustomLossProgram) in torch on the workers, one datum at a time, node by node.

Each allowed name of app.training_data.custom_loss_ops is bound here to its callable once; a node can call nothing
else. Before a node runs for real, its shape and FLOPs are found on the meta device (Planner: per datum length,
for the whole request) and checked against the limits. Autograd flows through every node, so the summed loss's
backward reaches the model. A loss that fails on the data (a shape mismatch, a non-scalar loss) is the user's
error, naming the node.

What bounds a request's loss on a rank: each tensor node's elements and the request's FLOPs (budget), each
arithmetic node on plain numbers to bounded integers (host), and, as the last line, the loss's time
(limits.max_custom_loss_seconds, checked before every node, planned or run): past it the loss fails as a user error
like any other, so the rank's passes go on in step with the other ranks' and the worker keeps serving. One node
alone is not interrupted; the bounds above keep each one short.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from app.errors import LimitExceeded, UserError
from app.training.custom_loss import host
from app.training.custom_loss.budget import TimeBudget, elements, metered, on_meta
from app.training_data.custom_loss_nodes import LossNode
from app.training_data.custom_loss_operands import arithmetic
from app.training_data.custom_loss_ops import FUNCTIONS
from app.training_data.custom_losses import CustomLossProgram

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


Call = Callable[[LossNode, Callable[..., Any], list[Any], dict[str, Any]], Any]


@dataclass(frozen=True)
class _Plan:
    flops: int  # the FLOPs of the nodes planned
    complete: bool  # every node planned: the real run needs no checks


class Planner:
    """A request's custom loss planned per datum length on the meta device, before any node runs for real: each
    node's output against limits.max_custom_loss_elements, the request's FLOPs against
    limits.max_custom_loss_flops_per_request. A node whose shape depends on the data (a boolean mask, a value read
    from a tensor) ends its plan; datums of that length are then checked node by node as they run. Planning and
    every run with this planner share the request's limits.max_custom_loss_seconds.

    A request the plan refuses is refused by each run (`running`), not here: the ranks construct their planners
    outside any pass and must go on alike, and a rank out of time stops planning where another goes on to find a
    node over a limit; in the passes a failed loss keeps them in step (app.training.engine)."""

    def __init__(self, program: CustomLossProgram, inputs: list[tuple[tuple[int, ...], torch.dtype]]) -> None:
        self._program = program
        self._inputs = inputs  # each input's shape per token and dtype, logprobs first
        self._plans: dict[int, _Plan] = {}
        self._flops_left = program.max_flops  # for the nodes no plan covers
        self._time = TimeBudget(program.max_seconds)
        self._refusal: LimitExceeded | None = None  # the plan's, raised by each run
        self.estimated_flops = 0  # the request's, once checked

    @classmethod
    def of_tensors(cls, program: CustomLossProgram, logprobs: torch.Tensor, inputs: dict[str, torch.Tensor]) -> Planner:
        tensors = [logprobs, *(inputs[name] for name in program.input_names)]
        return cls(program, [(tuple(t.shape[1:]), t.dtype) for t in tensors])

    def check(self, lengths: np.ndarray) -> None:
        """Plan the datums of these lengths (a request's); refuse them (in each run) if their FLOPs exceed the
        request's budget, or a node its elements, or the planning the time budget."""
        with self._time.running():
            try:
                self._check(lengths)
            except LimitExceeded as exc:
                self._refusal = exc

    def _check(self, lengths: np.ndarray) -> None:
        program = self._program
        unique, counts = np.unique(lengths, return_counts=True)
        plans = [(self._plan(int(length)), int(count)) for length, count in zip(unique, counts, strict=True)]
        total = self.estimated_flops = sum(plan.flops * count for plan, count in plans)
        if total > program.max_flops:
            raise LimitExceeded(
                f"custom loss {program.name!r} would take about {total:.3g} FLOPs over these {len(lengths)} datums "
                f"(estimated from their lengths before running); limits.max_custom_loss_flops_per_request is "
                f"{program.max_flops:.3g}: send fewer or shorter datums per request, or a cheaper loss",
                field=_FIELD,
            )
        self._flops_left = program.max_flops - sum(plan.flops * count for plan, count in plans if plan.complete)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Around a run of the loss: refused if the plan refused the request; its time counts against the
        request's."""
        if self._refusal is not None:
            raise self._refusal
        with self._time.running():
            yield

    def call_for(self, length: int) -> Call:
        """How a datum of this length runs its nodes: unchecked where its plan is complete, else checked; on time
        both."""
        return self._on_time if self._plan(length).complete else self._guarded

    def _plan(self, length: int) -> _Plan:
        if length not in self._plans:
            args = [torch.empty((length, *shape), dtype=dtype, device="meta") for shape, dtype in self._inputs]
            flops = 0

            def planned(node: LossNode, fn: Callable[..., Any], a: list[Any], k: dict[str, Any]) -> Any:
                nonlocal flops
                self._check_time(node)
                out, cost = metered(fn, a, k)
                self._check_elements(node, out)
                flops += cost
                return out

            try:
                _walk(self._program, args, planned)
                complete = True
            except LimitExceeded:
                raise
            except UserError:  # a shape the meta device cannot tell, or a failure the real run will report
                complete = False
            self._plans[length] = _Plan(flops, complete)
        return self._plans[length]

    def _on_time(self, node: LossNode, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        self._check_time(node)
        return fn(*args, **kwargs)

    def _guarded(self, node: LossNode, fn: Callable[..., Any], args: list[Any], kwargs: dict[str, Any]) -> Any:
        self._check_time(node)
        try:
            out, cost = metered(fn, on_meta(args), on_meta(kwargs))
        except _FAILURES:  # data-dependent: allowed operations then make no more elements than they read
            out, cost = metered(fn, args, kwargs)
            self._charge(node, out, cost)
            return out
        self._charge(node, out, cost)
        return fn(*args, **kwargs)

    def _charge(self, node: LossNode, out: Any, flops: int) -> None:
        self._check_elements(node, out)
        self._flops_left -= flops
        if self._flops_left < 0:
            raise LimitExceeded(
                f"custom loss {self._program.name!r}: node {node.name!r} exceeds "
                f"limits.max_custom_loss_flops_per_request ({self._program.max_flops:.3g} FLOPs) for this request: "
                "send fewer or shorter datums per request, or a cheaper loss",
                field=_FIELD,
            )

    def _check_time(self, node: LossNode) -> None:
        if self._time.spent():
            raise LimitExceeded(
                f"custom loss {self._program.name!r} ran past limits.max_custom_loss_seconds "
                f"({self._time.seconds:g} s on a worker for one request), stopped before node {node.name!r}: send "
                "fewer or shorter datums per request, or a cheaper loss",
                field=_FIELD,
            )

    def _check_elements(self, node: LossNode, out: Any) -> None:
        program = self._program
        if elements(out) > program.max_elements:
            raise LimitExceeded(
                f"custom loss {program.name!r}: node {node.name!r} would compute {elements(out)} elements; "
                f"limits.max_custom_loss_elements is {program.max_elements}",
                field=_FIELD,
            )


def run_custom_loss(
    program: CustomLossProgram,
    logprobs: torch.Tensor,
    inputs: dict[str, torch.Tensor],
    offsets: np.ndarray,
    planner: Planner | None = None,
) -> tuple[torch.Tensor, dict[str, tuple[float, float]]]:
    """The summed loss over the datums (rows offsets[i]:offsets[i+1]) and each metric as (sum over datums,
    number of datums): `:mean` metrics merge as sum / count, `:sum` metrics as the sum. `planner` has checked the
    whole request; without one, these datums are checked as the request."""
    if planner is None:
        planner = Planner.of_tensors(program, logprobs, inputs)
        planner.check(np.diff(offsets))
    if logprobs.is_cuda:  # the model's pass, still queued, is not the loss's time
        torch.cuda.synchronize(logprobs.device)
    total = logprobs.new_zeros(())
    sums: dict[str, float] = {}
    num_datums = len(offsets) - 1
    with planner.running():
        for i in range(num_datums):
            rows = slice(int(offsets[i]), int(offsets[i + 1]))
            args = [logprobs[rows], *(inputs[name][rows] for name in program.input_names)]
            loss, metrics = run_datum(program, args, planner.call_for(rows.stop - rows.start))
            total = total + loss
            for key, value in metrics.items():
                sums[key] = sums.get(key, 0.0) + value
    return total, {key: (value, float(num_datums)) for key, value in sums.items()}


def run_datum(
    program: CustomLossProgram, args: list[torch.Tensor], call: Call
) -> tuple[torch.Tensor, dict[str, float]]:
    """One datum's (scalar loss, metrics) from the program's inputs, in order, each node run by `call`."""
    node, env = _walk(program, args, call)
    return _output(program, node, env)


def _walk(program: CustomLossProgram, args: list[Any], call: Call) -> tuple[LossNode, dict[str, Any]]:
    """The output node and the values of the nodes before it."""
    env: dict[str, Any] = {}
    for node in program.nodes:
        if node.op == "placeholder":
            env[node.name] = args[len(env)]
        elif node.op == "output":
            return node, env
        else:
            env[node.name] = _call(program, node, env, call)
    raise UserError(f"custom loss {program.name!r} has no output", field=_FIELD)  # validation prevents this


def _call(program: CustomLossProgram, node: LossNode, env: dict[str, Any], call: Call) -> Any:
    device = next(v for v in env.values() if isinstance(v, torch.Tensor)).device
    args = [_decode(a, env, device) for a in node.args]
    kwargs = {k: _decode(v, env, device) for k, v in node.kwargs.items()}
    where = f"custom loss {program.name!r}, node {node.name!r} ({node.target})"
    if node.op == "call_method" and not isinstance(args[0], torch.Tensor):
        raise UserError(f"{where} calls a tensor method on a {type(args[0]).__name__}", field=_FIELD)
    on_host = node.op == "call_function" and arithmetic(node.target)
    if on_host:
        host.check_operands(where, node.target, args, kwargs, program.max_integer)
    fn = getattr(type(args[0]), node.target) if node.op == "call_method" else BOUND[node.target]
    try:
        out = call(node, fn, args, kwargs)
    except _FAILURES as exc:
        raise UserError(f"{where} failed: {exc}", field=_FIELD) from None
    if on_host:
        host.check_result(where, out, program.max_integer)
    return out


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
    """An argument as the SDK encoded it (validated: app.training_data.custom_losses)."""
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
