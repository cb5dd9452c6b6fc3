"""The trainer's engine on a GPU at realistic sizes: a randomly initialised Qwen3-8B-shaped model (36 layers, 4096
hidden, 32/8 heads, 12288 MLP, 151936 vocabulary, untied LM head; 8.2B parameters) at 16 x 2048 tokens and one
32,768-token datum, and Qwen2.5-0.5B's shape at 16 x 512. Driven in process (no Ray, no server), set up the way
app.ranks.command_loop sets up a rank: activation checkpointing, micro-batches of 16,384 tokens, and the base
sharded with FSDP2 over a one-rank NCCL group (world size 1) unless --no-fsdp.

    python bench/gpu_scale.py [--parts dtype,peft,fsdp,small] [--steps 3] [--out DIR]
    python bench/gpu_scale.py --parts long [--long-shapes 1x32768,1x65536] [--long-small-shapes 1x131072]
    python bench/gpu_scale.py --tiny --device cpu     # a smoke test of the script

Variants of our engine: a bf16 base, a bf16 base with autocast (LoRA matmuls in bf16: trainer.autocast), a float32
base. Baseline: plain PEFT + AdamW in this process on the bf16 base, with Hugging Face's gradient checkpointing, the
step cut into the same micro-batches (a plain loop cannot fit 16 x 2048 of a 151936 vocabulary in one pass). Per
variant and shape: median seconds per step (forward_backward + optim_step), tokens/s, MFU (6 N T plus the attention
scores, 12 x layers x seq x heads x head_dim x T, against --peak-tflops; N every matmul weight, the LM head included),
peak GiB, and the largest |logprob| difference from the float32 base on one 2048-token datum (same weights, before
training). Results stream to DIR/results.json as they come.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import socket
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from gpu_lora_step import ALPHA, LR, QWEN25_05B, RANK, TARGETS, packed, random_batch, synced
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen3Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: import app/

from app.messages import AdamParams, AdapterSpec
from app.training.base_model import recompute_activations, shard_base
from app.training.engine import TrainingEngine

QWEN3_8B: dict[str, Any] = {  # Qwen/Qwen3-8B's config.json
    "hidden_size": 4096,
    "intermediate_size": 12288,
    "num_hidden_layers": 36,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": False,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
}
TINY8B = dict(QWEN3_8B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, head_dim=16, vocab_size=1000)  # fmt: skip
QWEN3_06B: dict[str, Any] = {  # Qwen/Qwen3-0.6B's config.json
    "hidden_size": 1024,
    "intermediate_size": 3072,
    "num_hidden_layers": 28,
    "num_attention_heads": 16,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 40960,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
}
TINY06B = dict(QWEN3_06B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, vocab_size=1000)  # fmt: skip
TINY05B = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
               num_key_value_heads=2, vocab_size=1000)  # fmt: skip
MICRO_BATCH_TOKENS = 16384
SPEC = AdapterSpec(rank=RANK, seed=0, alpha=ALPHA)


def build(config: Any, dtype: torch.dtype, device: str) -> torch.nn.Module:
    """Random weights drawn in float32 with a fixed seed, then cast: every dtype holds the same weights."""
    torch.manual_seed(0)
    with torch.device(device):
        model: torch.nn.Module = AutoModelForCausalLM.from_config(
            config, dtype=torch.float32, attn_implementation="sdpa"
        )
    model = model.to(dtype).eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return model


def matmul_weights(model: torch.nn.Module) -> int:
    """N of 6 N T: every 2-D weight but the input embedding, counted once more as the LM head when tied."""
    n = sum(p.numel() for name, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in name)
    if model.config.tie_word_embeddings:
        n += model.get_input_embeddings().weight.numel()
    return n


def flops(model: torch.nn.Module, n_mm: int, tokens: int, seq: int) -> float:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return (6 * n_mm + 12 * c.num_hidden_layers * seq * c.num_attention_heads * head_dim) * tokens


def shape_of(text: str) -> tuple[int, int]:
    datums, tokens = text.split("x")
    return int(datums), int(tokens)


def timed_steps(step: Callable[[], Any], warmup: int, steps: int) -> tuple[list[float], float | None, str | None]:
    """(seconds of each timed step, peak GiB, None) or ([], None, the out-of-memory error)."""
    try:
        for _ in range(warmup):
            step()
        if torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
        times = []
        for _ in range(steps):
            started = time.perf_counter()
            step()
            times.append(time.perf_counter() - started)
        peak = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        return times, peak, None
    except torch.OutOfMemoryError as exc:
        return [], None, str(exc).split("\n")[0][:160]


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


class Bench:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.rows: list[dict[str, Any]] = []
        self.reference: dict[str, np.ndarray] = {}  # float32 logprobs of the probe datum, per model

    def run(self, part: Callable[..., None], *args: Any, **kwargs: Any) -> None:
        """One part; its models are freed when it returns."""
        part(*args, **kwargs)
        free()

    def record(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        step = f"{row['step_s']:.3f} s" if row.get("step_s") else row.get("error", "")
        extra = "".join(f"  {k} {row[k]}" for k in ("tok_s", "mfu", "peak_gib", "max_dlogprob") if k in row)
        print(f"{row['model']:5} {row['variant']:24} {row['shape']:8} {step}{extra}", flush=True)
        if self.args.out:
            self.args.out.mkdir(parents=True, exist_ok=True)
            (self.args.out / "results.json").write_text(json.dumps(self.rows, indent=2))

    def engine(
        self, base: torch.nn.Module, autocast: bool, fsdp: bool, checkpointing: bool, pass_tokens: int
    ) -> TrainingEngine:
        if checkpointing:
            recompute_activations(base)
        if fsdp:
            shard_base(base, self.args.device)
        engine = TrainingEngine(
            base, device=self.args.device, micro_batch_tokens=pass_tokens, sharded=fsdp, autocast=autocast
        )
        engine.create_model("m", SPEC)
        return engine

    def ours(
        self,
        model: str,
        config: Any,
        variant: str,
        shapes: list[str],
        fsdp: bool = True,
        checkpointing: bool = True,
        pass_tokens: int = MICRO_BATCH_TOKENS,
    ) -> None:
        dtype = torch.float32 if variant.startswith("float32") else torch.bfloat16
        base = build(config, dtype, self.args.device)
        n_mm = matmul_weights(base)
        engine = self.engine(base, "autocast" in variant, fsdp, checkpointing, pass_tokens)
        name = variant + ("" if fsdp else ", no fsdp") + ("" if checkpointing else ", no AC")
        name += "" if pass_tokens == MICRO_BATCH_TOKENS else f", passes of {pass_tokens}"
        probe = packed(random_batch(1, self.args.probe_tokens, config.vocab_size, seed=9))
        logprobs = engine.forward_backward("m", "cross_entropy", {}, probe, True).outputs["logprobs"]
        if variant == "float32":
            self.reference[model] = logprobs
        for text in shapes:
            datums, tokens = shape_of(text)
            batch = packed(random_batch(datums, tokens, config.vocab_size))

            def step(batch: Any = batch) -> None:
                engine.forward_backward("m", "cross_entropy", {}, batch, False)
                engine.optim_step("m", AdamParams(learning_rate=LR))

            steps = self.args.steps if dtype == torch.bfloat16 else max(1, self.args.steps - 1)
            row = self.measured(step, steps, base, n_mm, {"model": model, "variant": name, "shape": text})
            if model in self.reference and variant != "float32":
                row["max_dlogprob"] = float(np.abs(logprobs - self.reference[model]).max())
            self.record(row)
            free()

    def measured(
        self, step: Callable[[], Any], steps: int, base: torch.nn.Module, n_mm: int, row: dict[str, Any]
    ) -> dict[str, Any]:
        """`row` with the step's median time, tokens/s, MFU and peak memory (or its out-of-memory error)."""
        times, peak, error = timed_steps(synced(step), self.args.warmup, steps)
        if error:
            return {**row, "error": error}
        datums, tokens = shape_of(row["shape"])
        median, total = statistics.median(times), datums * tokens
        mfu = flops(base, n_mm, total, tokens) / median / (self.args.peak_tflops * 1e12)
        return {
            **row,
            "step_s": round(median, 4),
            "steps_s": times,
            "tok_s": round(total / median),
            "mfu": round(mfu, 3),
            "peak_gib": round(peak or 0.0, 2),
        }

    def peft(self, model: str, config: Any, shapes: list[str], checkpointing: bool) -> None:
        base = build(config, torch.bfloat16, self.args.device)
        n_mm = matmul_weights(base)
        if checkpointing:
            base.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            base.train()  # Hugging Face recomputes only in training mode (these models have no dropout)
        torch.manual_seed(0)
        peft = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=int(ALPHA), lora_dropout=0.0, target_modules=TARGETS))
        params = [p for p in peft.parameters() if p.requires_grad]
        opt = torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0, fused=True)
        for text in shapes:
            datums, tokens = shape_of(text)
            inputs, targets, weights = random_batch(datums, tokens, config.vocab_size)
            per = max(1, MICRO_BATCH_TOKENS // tokens)
            parts = [
                tuple(torch.from_numpy(a[i : i + per]).to(self.args.device) for a in (inputs, targets, weights))
                for i in range(0, datums, per)
            ]

            def step(parts: list = parts) -> None:
                for x, y, w in parts:
                    logits = peft(input_ids=x, use_cache=False).logits.float()
                    lp = torch.log_softmax(logits, -1).gather(-1, y[..., None]).squeeze(-1)
                    (-(w * lp).sum()).backward()
                    del logits, lp
                opt.step()
                opt.zero_grad(set_to_none=True)

            variant = "PEFT bf16" + (", HF checkpointing" if checkpointing else "")
            row = self.measured(step, self.args.steps, base, n_mm, {"model": model, "variant": variant, "shape": text})
            self.record(row)
            free()


def init_group(device: str) -> None:
    """A one-rank process group, as Ray Train makes for a worker group of one (FSDP2 shards over it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device == "cuda" else "gloo", rank=0, world_size=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="dtype,peft,fsdp,small")
    parser.add_argument("--shapes", default="16x2048,1x32768")
    parser.add_argument("--small-shapes", default="16x512")
    parser.add_argument("--long-shapes", default="1x32768,1x65536", help="part long: the 8B model's datums")
    parser.add_argument("--long-small-shapes", default="1x65536,1x131072", help="part long: the 0.6B model's")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--probe-tokens", type=int, default=2048, help="the datum logprobs are compared on")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models of the same families (smoke test)")
    parser.add_argument("--peak-tflops", type=float, default=989.0, help="H100 SXM dense bf16")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    parts = set(args.parts.split(","))
    big = Qwen3Config(**(TINY8B if args.tiny else QWEN3_8B))
    small = Qwen2Config(**(TINY05B if args.tiny else QWEN25_05B))
    shapes, small_shapes = args.shapes.split(","), args.small_shapes.split(",")
    init_group(args.device)
    bench = Bench(args)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name() if args.device == 'cuda' else 'cpu'}")
    if "dtype" in parts:
        for variant in ("float32", "bf16", "bf16 + autocast"):
            bench.run(bench.ours, "8b", big, variant, shapes)
    if "peft" in parts:
        bench.run(bench.peft, "8b", big, shapes, checkpointing=True)
    if "fsdp" in parts:
        bench.run(bench.ours, "8b", big, "bf16", shapes[:1], fsdp=False)
    if "passes" in parts:  # what the step's pass size and checkpointing do to MFU (autocast on)
        for checkpointing, pass_tokens in ((True, 32768), (False, 4096), (False, 8192)):
            bench.run(bench.ours, "8b", big, "bf16 + autocast", shapes[:1], True, checkpointing, pass_tokens)
    if "long" in parts:  # one long datum whole on one rank, the default engine (bf16, checkpointing) with autocast
        long_small = Qwen3Config(**(TINY06B if args.tiny else QWEN3_06B))
        bench.run(bench.ours, "8b", big, "bf16 + autocast", args.long_shapes.split(","))
        bench.run(bench.ours, "0.6b", long_small, "bf16 + autocast", args.long_small_shapes.split(","))
    if "small" in parts:
        bench.run(bench.ours, "0.5b", small, "float32", small_shapes, fsdp=False, checkpointing=False)
        for variant in ("bf16", "bf16 + autocast"):
            bench.run(bench.ours, "0.5b", small, variant, small_shapes, fsdp=False, checkpointing=False)
        bench.run(bench.ours, "0.5b", small, "bf16", small_shapes, fsdp=False)
        bench.run(bench.peft, "0.5b", small, small_shapes, checkpointing=False)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
