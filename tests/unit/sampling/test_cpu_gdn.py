"""The float32 CPU Gated DeltaNet's delta rules equal transformers' torch ones, which the trainer runs (chunked for a
prompt, token by token for decoding, from a prior state); the Sampler's side of Qwen3.5 against the trainer's logprobs
is the families' probe. vLLM's own BF16 kernel runs only the heads it takes (the tiny presets' 32-wide ones go to
torch: served in BF16 they failed every sample). And Qwen3.5's plugin maps the trainer's adapter names onto vLLM's
modules."""

from __future__ import annotations

import pytest
import torch
from transformers.models.qwen3_5.modeling_qwen3_5 import torch_chunk_gated_delta_rule

from app.sampling.cpu_gdn import _chunked, _recurrent, runs_vllm_kernel
from tests.tolerances import assert_sums_close

K_HEADS, V_HEADS, K_DIM, V_DIM = 2, 4, 16, 8


def _terms(tokens: int) -> int:
    """The delta rule's chain of sums (tests/tolerances.py): each token's key contraction into the running state."""
    return tokens * K_DIM


def _inputs(tokens: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator().manual_seed(tokens)
    q, k = (torch.randn(1, tokens, K_HEADS, K_DIM, generator=gen) for _ in range(2))
    v = torch.randn(1, tokens, V_HEADS, V_DIM, generator=gen)
    g, beta = -torch.rand(tokens, V_HEADS, generator=gen), torch.rand(tokens, V_HEADS, generator=gen)
    state = torch.randn(1, V_HEADS, K_DIM, V_DIM, generator=gen) * 0.1
    return q, k, v, g, beta, state


def _reference(q, k, v, g, beta, state):  # type: ignore[no-untyped-def]
    repeat = V_HEADS // K_HEADS
    return torch_chunk_gated_delta_rule(
        q.repeat_interleave(repeat, 2),
        k.repeat_interleave(repeat, 2),
        v,
        g=g[None],
        beta=beta[None],
        initial_state=state,
        output_final_state=True,
        use_qk_l2norm_in_kernel=True,
    )


@pytest.mark.parametrize("tokens", [5, 64, 130])
def test_chunked_is_transformers(tokens: int) -> None:
    q, k, v, g, beta, state = _inputs(tokens)
    out, final = _reference(q, k, v, g, beta, state)
    ours, our_final = _chunked(None, q, k, v, g[None], beta[None], state)
    assert_sums_close(ours, out, _terms(tokens))
    assert_sums_close(our_final, final, _terms(tokens))
    _, zero_final = _reference(q, k, v, g, beta, torch.zeros_like(state))
    assert_sums_close(_chunked(None, q, k, v, g[None], beta[None], None)[1], zero_final, _terms(tokens))


def test_recurrent_steps_are_the_chunked_rule() -> None:
    q, k, v, g, beta, state = _inputs(20)
    out, final = _reference(q, k, v, g, beta, state)
    steps = []
    for t in range(20):
        step, state = _recurrent(
            None, q[:, t : t + 1], k[:, t : t + 1], v[:, t : t + 1], g[t][None], beta[t][None], state
        )
        steps.append(step)
    assert_sums_close(torch.cat(steps, 1), out, _terms(20))
    assert_sums_close(state, final, _terms(20))


def test_qwen3_5_maps_trainer_adapter_names() -> None:
    from vllm.lora.utils import parse_fine_tuned_lora_name

    from app.sampling import qwen3_5

    qwen3_5.install()
    from vllm.model_executor.models.qwen3_5 import Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration

    for model in (Qwen3_5ForConditionalGeneration, Qwen3_5MoeForConditionalGeneration):
        mapper = model.hf_to_vllm_mapper.get_rename_mapper()
        name, is_a = parse_fine_tuned_lora_name("base_model.model.model.layers.3.mlp.gate_proj.lora_A.weight", mapper)
        assert (name, is_a) == ("language_model.model.layers.3.mlp.gate_proj", True)
        assert mapper.map_name("model.language_model.layers.3.mlp.gate_proj.weight") == (
            "language_model.model.layers.3.mlp.gate_proj.weight"
        )


@pytest.mark.parametrize("head_dim", [32, 64, 96, 128])
def test_only_heads_vllms_bf16_kernel_takes_are_given_to_it(head_dim: int) -> None:
    from vllm import _custom_ops as ops

    tokens, heads = 8, 2
    q, k, v = (torch.randn(1, tokens, heads, head_dim, dtype=torch.bfloat16) for _ in range(3))

    def kernel() -> None:
        ops.chunk_gated_delta_rule_cpu(
            query=q,
            key=k,
            value=v,
            g=-torch.rand(1, tokens, heads),
            beta=torch.rand(1, tokens, heads, dtype=torch.bfloat16),
            initial_state=torch.zeros(1, heads, head_dim, head_dim),
            output_final_state=True,
            cu_seqlens=torch.tensor([0, tokens], dtype=torch.int32),
            head_first=False,
            use_qk_l2norm_in_kernel=True,
            initial_state_indices=torch.tensor([0], dtype=torch.int32),
        )

    if runs_vllm_kernel(torch.bfloat16, head_dim, head_dim):
        kernel()
    else:
        with pytest.raises(RuntimeError, match="head dim"):
            kernel()
    assert not runs_vllm_kernel(torch.float32, head_dim, head_dim)  # "CPU GDN attention requires BF16"
