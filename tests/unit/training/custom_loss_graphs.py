"""Custom losses traced and encoded by the real SDK (tinker 0.38), as create_custom_loss sends them."""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from tinker.lib.public_interfaces.custom_loss import encode_graph, trace_loss

from app.training_data.custom_losses import CustomLossProgram, validate_custom_loss


def clipped_pg(logprobs, advantages, old_logprobs):  # type: ignore[no-untyped-def]
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = torch.clamp(ratio, 0.8, 1.2)
    loss = -torch.minimum(ratio * advantages, clipped * advantages).sum() + 0.1 * F.softplus(-logprobs).mean()
    n = logprobs.shape[0]
    length = torch.ones_like(loss) * n
    return loss, {"custom/ratio:mean": ratio.mean(), "custom/tokens:sum": length}


def request(fn: Any, ranks: dict[str, int]) -> dict[str, Any]:
    """The create_custom_loss body's name, inputs and graph, as plain JSON."""
    handle = trace_loss(fn, ranks, "s")  # type: ignore[arg-type]
    return {
        "name": handle.name,
        "inputs": [i.model_dump() for i in handle.inputs],
        "graph": encode_graph(handle).model_dump(),
    }


def program(fn: Any, ranks: dict[str, int], max_nodes: int = 512) -> CustomLossProgram:
    body = copy.deepcopy(request(fn, ranks))
    return validate_custom_loss("s:loss:0", body["name"], body["inputs"], body["graph"], max_nodes)
