"""Sequence parallelism (Ulysses): the ranks of a group run one long datum together, each its own consecutive slice
of the tokens, so a rank holds and computes 1/N of the datum's activations.

Everything a decoder does token by token (embeddings, norms, projections, MLPs and experts, the LM head) runs on a
rank's own slice as it is. Where tokens meet, the ranks exchange:
- softmax attention: an all-to-all turns the rank's queries, keys and values for all heads and its tokens into all
  tokens for 1/N of the heads; attention runs causally over the whole datum for those heads, and a second all-to-all
  turns the outputs back (transformers' "sdpa" attention function, wrapped);
- Gated DeltaNet (Qwen3.5's linear attention): its short causal convolution takes the last kernel-1 positions of the
  previous rank's slice (a halo), and its recurrence runs over the whole datum for 1/N of the heads, between the same
  two all-to-alls (Qwen3.5's module functions, wrapped).
Each exchange is an autograd function whose backward is the reverse exchange, so gradients flow across ranks as the
activations did. Outside `SequenceGroup.running` the wrapped functions are the originals, untouched.

The datum's per-token predictions are then gathered on every rank of the group (`gather_tokens`), so any loss, a
custom one included, sees the whole datum, and each rank backpropagates its own tokens' part of it.
"""

from __future__ import annotations

import contextlib
import importlib
import math
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.distributed as dist

_active: SequenceGroup | None = None  # the group of the pass running now, if it is a sequence-parallel one
# transformers' modules whose Gated DeltaNet functions are wrapped
_GATED_DELTANET_MODULES = (
    "transformers.models.qwen3_5.modeling_qwen3_5",
    "transformers.models.qwen3_5_moe.modeling_qwen3_5_moe",
)


class SequenceGroup:
    """The ranks that split a long datum between them: `ranks` of the default process group, in token order."""

    def __init__(self, ranks: list[int], rank: int) -> None:
        """Every rank of the default group must build every group, in the same order (`dist.new_group` is a
        collective); `rank` is this process's."""
        self.ranks = ranks
        self.size = len(ranks)
        self.index = ranks.index(rank) if rank in ranks else -1
        self.group = dist.new_group(ranks) if self.size > 1 else None

    def span(self, length: int) -> tuple[int, int]:
        """This rank's tokens of a datum of `length` tokens: [start, stop) (every rank's slice has
        ceil(length / size) positions, the last ones padded)."""
        per = self.slice_length(length)
        start = min(length, self.index * per)
        return start, min(length, start + per)

    def slice_length(self, length: int) -> int:
        return math.ceil(length / self.size)

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        """Within it, the model's attention and linear-attention layers exchange across this group."""
        global _active
        install()
        _active, before = self, _active
        try:
            yield
        finally:
            _active = before


def gather_tokens(own: torch.Tensor, group: SequenceGroup, length: int) -> torch.Tensor:
    """Every rank's `own` per-token values ([own tokens, ...], consecutive slices in rank order) as the whole
    datum's [length, ...], on every rank. Each rank computes the same loss from it, so the gradient of a rank's own
    slice is its part of the whole's gradient (not a sum over ranks)."""
    return _GatherTokens.apply(own, group, length)


def install() -> None:
    """Wrap transformers' sdpa attention and the Gated DeltaNet functions (once a process; idempotent)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if not getattr(ALL_ATTENTION_FUNCTIONS["sdpa"], "_sequence_parallel", False):
        AttentionInterface.register("sdpa", _wrapped(sdpa_attention_forward, _attention))
    for name in _GATED_DELTANET_MODULES:
        module = importlib.import_module(name)
        for function, around in (("causal_conv1d_fn", _causal_conv), ("torch_chunk_gated_delta_rule", _delta_rule)):
            original = getattr(module, function)
            if not getattr(original, "_sequence_parallel", False):
                setattr(module, function, _wrapped(original, around))


def _wrapped(original: Callable[..., Any], around: Callable[..., Any]) -> Callable[..., Any]:
    """`original` outside a sequence-parallel pass; `around(group, original, ...)` inside one."""

    def function(*args: Any, **kwargs: Any) -> Any:
        if _active is None:
            return original(*args, **kwargs)
        return around(_active, original, *args, **kwargs)

    function._sequence_parallel = True  # type: ignore[attr-defined]
    return function


def _attention(
    group: SequenceGroup,
    original: Callable[..., tuple[torch.Tensor, Any]],
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """[batch, heads, own tokens, dim] in, [batch, own tokens, heads, dim] out (what transformers' attention
    functions take and give), with causal attention over the whole datum. The mask built for the rank's slice alone
    is not used: a sequence-parallel datum has no padding but its tail. The key/value heads divide by the group's size
    (app.training.datum_layout.sequence_parallel_size), so each rank's query heads keep theirs."""
    q, k, v = (_AllToAll.apply(t, group, 1, 2) for t in (query, key, value))  # heads scattered, tokens gathered
    kwargs.pop("is_causal", None)
    out, _ = original(module, q, k, v, None, is_causal=True, **kwargs)
    return _AllToAll.apply(out, group, 1, 2), None  # tokens scattered, heads gathered


def _causal_conv(
    group: SequenceGroup,
    original: Callable[..., torch.Tensor],
    hidden_states: torch.Tensor,
    weight: torch.Tensor,
    *args: Any,
    **kwargs: Any,
) -> torch.Tensor:
    """The depthwise causal convolution ([batch, channels, own tokens]) of a rank's slice, continuing from the last
    kernel-1 positions of the previous rank's (zeros before the first rank's, as the convolution pads)."""
    halo = weight.shape[-1] - 1
    previous = _PreviousTail.apply(hidden_states[..., -halo:].contiguous(), group)
    out = original(torch.cat([previous, hidden_states], dim=-1), weight, *args, **kwargs)
    return out[..., halo:]


def _delta_rule(
    group: SequenceGroup,
    original: Callable[..., tuple[torch.Tensor, Any]],
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    **kwargs: Any,
) -> tuple[torch.Tensor, Any]:
    """The gated delta rule's recurrence ([batch, own tokens, heads, ...]) over the whole datum for 1/N of the
    heads. No recurrent state crosses a pass (training keeps none)."""
    q, k, v, g, beta = (_AllToAll.apply(t, group, 2, 1) for t in (query, key, value, g, beta))
    out, state = original(q, k, v, g, beta, **kwargs)
    return _AllToAll.apply(out, group, 1, 2), state


def all_to_all(x: torch.Tensor, group: SequenceGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
    """`x` cut into group.size pieces along `scatter_dim`, piece i sent to the group's rank i; the pieces received
    joined along `gather_dim` in rank order."""
    pieces = torch.stack(x.chunk(group.size, dim=scatter_dim)).contiguous()
    received = torch.empty_like(pieces)
    dist.all_to_all_single(received, pieces, group=group.group)
    return torch.cat(received.unbind(0), dim=gather_dim)


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: SequenceGroup, scatter_dim: int, gather_dim: int) -> torch.Tensor:
        ctx.group, ctx.dims = group, (scatter_dim, gather_dim)
        if x.shape[scatter_dim] % group.size:
            raise ValueError(
                f"sequence parallelism over {group.size} ranks needs heads divisible by {group.size}, got "
                f"{x.shape[scatter_dim]}"
            )
        return all_to_all(x, group, scatter_dim, gather_dim)

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        scatter_dim, gather_dim = ctx.dims
        return all_to_all(grads[0], ctx.group, gather_dim, scatter_dim), None, None, None


class _PreviousTail(torch.autograd.Function):
    """The previous rank's `tail` (zeros on the first rank); the backward sends each tail's gradient back."""

    @staticmethod
    def forward(ctx: Any, tail: torch.Tensor, group: SequenceGroup) -> torch.Tensor:
        ctx.group = group
        tails = _all_gather(tail, group)
        return torch.zeros_like(tail) if group.index == 0 else tails[group.index - 1]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None]:
        group = ctx.group
        received = _all_gather(grads[0].contiguous(), group)  # rank i's: the gradient of rank i-1's tail
        last = group.index == group.size - 1
        return torch.zeros_like(grads[0]) if last else received[group.index + 1], None


class _GatherTokens(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, own: torch.Tensor, group: SequenceGroup, length: int) -> torch.Tensor:
        per = group.slice_length(length)
        start, stop = group.span(length)
        ctx.span = (start, stop)
        padded = own.new_zeros((per, *own.shape[1:]))
        padded[: stop - start] = own
        return torch.cat(_all_gather(padded, group))[:length]

    @staticmethod
    def backward(ctx: Any, *grads: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        start, stop = ctx.span
        return grads[0][start:stop].contiguous(), None, None


def _all_gather(x: torch.Tensor, group: SequenceGroup) -> list[torch.Tensor]:
    out = [torch.empty_like(x) for _ in range(group.size)]
    dist.all_gather(out, x, group=group.group)
    return out
