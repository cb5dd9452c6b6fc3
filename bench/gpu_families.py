"""Every model family's trainer on a GPU, set up as a one-worker rank is (bf16 base, activation checkpointing, passes of
16,384 tokens): a randomly initialised model of each family at one shape (1024 hidden, 12 layers, 16/8 heads, 32,000
vocabulary; the mixtures of experts with 32 experts, 4 per token; the hybrids with their real mix of layer kinds),
MLP-only rank-32 LoRA (expert LoRA on the MoEs), 8 x 1024 random tokens; `--lineup`: a Qwen3.5-9B-shaped and a
Qwen3.5-35B-A3B-shaped (12 of its 40 layers) language model, 8 x 2048 tokens. Per family: median seconds per step
(forward_backward + optim_step) of 3 after a warm-up, tokens/s, the loss of the first and last step, peak GiB. In
process, torch only (no Ray, no vLLM).

    python bench/gpu_families.py [--steps 3] [--lineup] [--out DIR]
    python bench/gpu_families.py --tiny --device cpu     # a smoke test of the script
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, AutoModelForCausalLM

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: import app/
from app.messages import AdamParams, AdapterSpec
from app.training.base_model import load_base_model, recompute_activations
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch

DENSE = {"hidden_size": 1024, "num_hidden_layers": 12, "num_attention_heads": 16, "num_key_value_heads": 8,
         "head_dim": 64, "intermediate_size": 3072, "vocab_size": 32000}  # fmt: skip
MOE = {"moe_intermediate_size": 512, "num_experts": 32, "num_experts_per_tok": 4}
ROUTED = {"moe_intermediate_size": 512, "n_routed_experts": 32, "num_experts_per_tok": 4, "n_shared_experts": 1,
          "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1}  # fmt: skip
GATED_DELTANET = {"linear_num_key_heads": 8, "linear_num_value_heads": 16, "linear_key_head_dim": 64,
                  "linear_value_head_dim": 64}  # fmt: skip
FAMILIES = {
    "qwen3": DENSE,
    "llama": DENSE,
    "qwen3_moe": DENSE | MOE,
    "gpt_oss": DENSE | {"intermediate_size": 512, "num_local_experts": 32, "num_experts_per_tok": 4,
                        "sliding_window": 128},
    "qwen3_5_text": DENSE | GATED_DELTANET,  # Qwen3.5's language model, as the trainer loads it
    "qwen3_5_moe_text": DENSE | GATED_DELTANET | MOE | {"shared_expert_intermediate_size": 512},
    "nemotron_h": DENSE | {"n_routed_experts": 32, "num_experts_per_tok": 4, "moe_intermediate_size": 512,
                           "moe_shared_expert_intermediate_size": 1024, "mamba_num_heads": 32, "mamba_head_dim": 64,
                           "n_groups": 8, "ssm_state_size": 128},
    "deepseek_v3": DENSE | ROUTED | {"num_key_value_heads": 16, "q_lora_rank": 512, "kv_lora_rank": 512,
                                     "qk_rope_head_dim": 64, "qk_nope_head_dim": 64, "v_head_dim": 64},
    "glm4_moe": DENSE | ROUTED,
}  # fmt: skip
# the lineup's shapes the issue names (Qwen3.5-9B, and 35B-A3B with 12 of its 40 layers), 8 x 2048 tokens: --lineup
LINEUP = {
    "qwen3_5_text": {"hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 16, "num_key_value_heads": 4,
                     "head_dim": 256, "intermediate_size": 12288, "vocab_size": 248320, "linear_num_key_heads": 16,
                     "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128},
    "qwen3_5_moe_text": {"hidden_size": 2048, "num_hidden_layers": 12, "num_attention_heads": 16,
                         "num_key_value_heads": 2, "head_dim": 256, "vocab_size": 248320, "moe_intermediate_size": 512,
                         "shared_expert_intermediate_size": 512, "num_experts": 256, "num_experts_per_tok": 8,
                         "linear_num_key_heads": 16, "linear_num_value_heads": 32, "linear_key_head_dim": 128,
                         "linear_value_head_dim": 128},
}  # fmt: skip
TINY = {"hidden_size": 64, "num_hidden_layers": 12, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
        "intermediate_size": 128, "moe_intermediate_size": 32, "vocab_size": 512}  # fmt: skip


def batch(datums: int, length: int, vocab: int) -> PackedBatch:
    rng = np.random.default_rng(0)
    total = datums * length
    offsets = np.arange(0, total + 1, length, dtype=np.int64)
    inputs = {"target_tokens": rng.integers(0, vocab, total), "weights": np.ones(total, np.float32)}
    return PackedBatch(rng.integers(0, vocab, total), offsets, inputs)


def _layer_types(family: str, layers: int) -> dict:
    """The mix of layer kinds each hybrid family's real models have, over `layers` layers."""
    if family == "gpt_oss":  # alternating sliding-window and full attention
        return {"layer_types": ["sliding_attention", "full_attention"] * (layers // 2)}
    if family.startswith("qwen3_5"):  # three Gated DeltaNet layers, then full attention
        return {"layer_types": (["linear_attention"] * 3 + ["full_attention"]) * (layers // 4)}
    if family == "nemotron_h":  # Mamba2 and expert layers, with attention every third pair
        return {"layers_block_type": (["mamba", "moe"] * 2 + ["attention", "moe"]) * (layers // 6)}
    return {}


def run(family: str, shape: dict, device: str, steps: int, datums: int, length: int) -> dict:
    shape = shape | _layer_types(family, shape["num_hidden_layers"])
    if family == "deepseek_v3":  # latent attention: a latent for every head; its rotary part is the "head dim"
        shape = shape | {"num_key_value_heads": shape["num_attention_heads"], "head_dim": shape["qk_rope_head_dim"]}
    config = AutoConfig.for_model(family, **shape)
    with tempfile.TemporaryDirectory() as tmp:
        torch.manual_seed(0)
        AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(tmp)
        base = load_base_model(tmp, torch.bfloat16, device)
    recompute_activations(base)
    engine = TrainingEngine(base, device=device)
    engine.create_model("m", AdapterSpec(rank=32, seed=0, train_attn=False))
    data = batch(datums, length, shape["vocab_size"])
    losses, times = [], []
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    for _ in range(steps + 1):
        started = time.perf_counter()
        losses.append(engine.forward_backward("m", "cross_entropy", {}, data, forward_only=False).loss_sum)
        engine.optim_step("m", AdamParams(learning_rate=1e-3))
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - started)
    step = statistics.median(times[1:])
    peak = torch.cuda.max_memory_allocated() / 2**30 if device == "cuda" else None
    params = sum(p.numel() for p in base.parameters() if not p.requires_grad)
    return {"family": family, "base_parameters": params, "seconds_per_step": round(step, 3),
            "tokens_per_second": round(datums * length / step), "first_loss": round(losses[0], 1),
            "last_loss": round(losses[-1], 1), "peak_gib": None if peak is None else round(peak, 2)}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--tiny", action="store_true", help="tiny shapes and 2 x 32 tokens (a smoke test)")
    parser.add_argument("--lineup", action="store_true", help="the lineup's shapes (LINEUP), 8 x 2048 tokens")
    parser.add_argument("--max-layers", type=int, default=None, help="cut each shape to this many layers")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    datums, length = (2, 32) if args.tiny else (8, 2048) if args.lineup else (8, 1024)
    results = []
    for family, shape in (LINEUP if args.lineup else FAMILIES).items():
        shape = shape | (TINY if args.tiny else {})
        if args.max_layers:
            shape = shape | {"num_hidden_layers": min(shape["num_hidden_layers"], args.max_layers)}
        results.append(run(family, shape, args.device, args.steps, datums, length))
        print(json.dumps(results[-1]), flush=True)
        if args.out:  # after each family: a run stopped at its time limit keeps what it measured
            args.out.mkdir(parents=True, exist_ok=True)
            (args.out / "gpu_families.json").write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
