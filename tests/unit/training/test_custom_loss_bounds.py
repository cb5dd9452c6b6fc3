"""A custom loss's bounds: a node's elements refused before it allocates, a request's FLOPs refused before any node
runs, and the lists of a graph bounded when the loss is created."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from dataclasses import replace

import numpy as np
import pytest
import torch

from app.errors import LimitExceeded
from app.training.custom_loss.interpreter import run_custom_loss
from tests.unit.training.custom_loss_graphs import program, request

_OVERSIZED = """
import resource, numpy as np, torch
from dataclasses import replace
from app.errors import LimitExceeded
from app.training.custom_loss.interpreter import run_custom_loss
from tests.unit.training.custom_loss_graphs import program

def outer(logprobs):
    return torch.outer(logprobs, logprobs).sum(), {}

T = 16384  # the outer product: 2^28 float32 elements, 1 GiB; the limit is 2^26, four times fewer
loss = replace(program(outer, {"logprobs": 1}), max_elements=2**26)
logprobs = torch.zeros(T)
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
try:
    run_custom_loss(loss, logprobs, {}, np.array([0, T]))
except LimitExceeded as exc:
    print("refused", (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) // 1024, exc)
"""


def test_a_node_over_the_element_limit_is_refused_before_it_allocates() -> None:
    done = subprocess.run([sys.executable, "-c", _OVERSIZED], capture_output=True, text=True, timeout=120, check=True)
    word, grown_mib, message = done.stdout.split(" ", 2)
    assert word == "refused", done.stdout + done.stderr
    assert int(grown_mib) < 200  # the outer product would take 1024 MiB
    assert "node 'outer'" in message and "limits.max_custom_loss_elements" in message


def _pairwise(logprobs, advantages):  # type: ignore[no-untyped-def]
    gram = torch.outer(logprobs, advantages)  # [T, T]
    return (gram @ gram @ gram).mean(), {}


def test_a_request_over_the_flop_budget_is_refused_before_any_node_runs() -> None:
    loss = replace(program(_pairwise, {"logprobs": 1, "advantages": 1}), max_flops=2**40)  # the default
    T, datums = 2048, 1024  # two [T, T] matmuls a datum: ~3.5e13 FLOPs, hours of a CPU (one datum's: seconds)
    offsets = np.arange(datums + 1) * T
    logprobs = torch.zeros(datums * T)
    run_custom_loss(loss, torch.zeros(2), {"advantages": torch.zeros(2)}, np.array([0, 2]))  # a process's first
    # meta run loads torch's meta kernels (~3 s, once)
    started = time.perf_counter()
    with pytest.raises(LimitExceeded, match=r"limits\.max_custom_loss_flops_per_request") as info:
        run_custom_loss(loss, logprobs, {"advantages": torch.zeros(datums * T)}, offsets)
    assert time.perf_counter() - started < 1.0
    assert re.search(r"about 3\.5\de\+13 FLOPs over these 1024 datums", str(info.value))


def test_a_loss_within_the_flop_budget_runs_and_a_smaller_budget_refuses_it() -> None:
    loss = program(_pairwise, {"logprobs": 1, "advantages": 1})
    offsets, logprobs = np.array([0, 8, 24]), torch.ones(24)
    run_custom_loss(loss, logprobs, {"advantages": torch.ones(24)}, offsets)
    with pytest.raises(LimitExceeded, match="max_custom_loss_flops_per_request"):
        run_custom_loss(replace(loss, max_flops=10_000), logprobs, {"advantages": torch.ones(24)}, offsets)


def _masked(logprobs, advantages):  # type: ignore[no-untyped-def]
    kept = logprobs[advantages > 0]  # a size the meta device cannot tell: checked as it runs
    return torch.outer(kept, kept).sum(), {}


def test_a_data_dependent_node_is_checked_as_it_runs() -> None:
    loss = replace(program(_masked, {"logprobs": 1, "advantages": 1}), max_elements=1024)
    offsets, logprobs = np.array([0, 40]), torch.ones(40)
    run_custom_loss(loss, logprobs, {"advantages": torch.arange(40.0) - 8}, offsets)  # 31 kept: 961 elements
    with pytest.raises(LimitExceeded, match="node 'outer' would compute 1089 elements"):
        run_custom_loss(loss, logprobs, {"advantages": torch.arange(40.0) - 6}, offsets)  # 33 kept
    with pytest.raises(LimitExceeded, match="max_custom_loss_flops_per_request"):
        run_custom_loss(replace(loss, max_flops=200), logprobs, {"advantages": torch.arange(40.0) - 8}, offsets)


def _stacked(logprobs):  # type: ignore[no-untyped-def]
    return torch.stack([logprobs] * 3).sum(), {}


def test_an_over_long_list_is_refused_at_creation_naming_the_field() -> None:
    from app.training_data.custom_losses import validate_custom_loss

    body = request(_stacked, {"logprobs": 1})
    node = next(n for n in body["graph"]["nodes"] if n["target"] == "torch.stack")
    node["args"][0] = node["args"][0] * 100  # 300 refs
    with pytest.raises(LimitExceeded) as info:
        validate_custom_loss("s:loss:0", body["name"], body["inputs"], body["graph"], 512)
    index = body["graph"]["nodes"].index(node)
    assert info.value.field == f"graph.nodes[{index}].args"
    assert "holds 300 items" in str(info.value)
