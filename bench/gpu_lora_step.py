"""GPU LoRA train-step benchmark: the trainer's engine (app.training.engine.TrainingEngine, driven in process:
world_size 1, no Ray, no server) against a plain in-process PEFT + AdamW step, on a randomly initialised bf16 model of
Qwen2.5-0.5B's shape, LoRA rank 32 on every projection the server adapts (q, k, v, o, gate, up, down).

    python bench/gpu_lora_step.py [--shapes 8x64,16x512,32x1024,32x1024/4] [--steps 8] [--rounds 3] [--out DIR]

One step is forward_backward("cross_entropy") + optim_step (AdamW) for the engine, and the same forward, summed
cross-entropy of the target tokens, backward and AdamW step for PEFT; both end in a device synchronisation. A shape
DATUMSxTOKENS/M splits the step into M forward_backward calls (PEFT: M backward passes) before the one optimizer step.
Steps of the two alternate so that machine noise hits both. Prints, per shape: the median seconds per step of each
(median of all timed steps; results.json has the spread of the per-round medians), ours / PEFT, the engine's tokens/s
and MFU, and the peak GPU memory of one step (OOM: it does not fit). MFU counts FLOPs two ways, against
--peak-tflops (H100 SXM dense bf16: 989):
  MFU(6N):   6 * N * T + 12 * layers * seq * hidden * T   (N: every matmul weight, the tied LM head included; the
             attention term counts the full, non-causal score matrix; the usual full fine-tune convention)
  MFU(lora): 4 * N * T + 6 * N_lora * T + the same attention term   (the work LoRA needs: no base weight gradients)
Then the engine with one LoRA model against --models models (each stepped alone and round robin: time per step and
memory), the engine on a float32 base (what app.ranks.command_loop loads today) without and with TF32, and last the
top CUDA ops of profiled engine and PEFT steps. --out writes results.json and profile.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import re
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from transformers import AutoModelForCausalLM, Qwen2Config

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a script from anywhere: import app/

from app.messages import AdamParams, AdapterSpec
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch

RANK, ALPHA, LR = 32, 32.0, 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # as the server adapts
QWEN25_05B: dict[str, Any] = {  # Qwen/Qwen2.5-0.5B's config.json
    "hidden_size": 896,
    "intermediate_size": 4864,
    "num_hidden_layers": 24,
    "num_attention_heads": 14,
    "num_key_value_heads": 2,
    "vocab_size": 151936,
    "tie_word_embeddings": True,
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 1000000.0,
}
TINY = dict(QWEN25_05B, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, vocab_size=1000)  # fmt: skip

Step = Callable[[], Any]
AUTOCAST: list[str] = []  # --autocast: the device type to run forward passes under bf16 autocast on


def autocast() -> contextlib.AbstractContextManager[Any]:
    return torch.autocast(AUTOCAST[0], dtype=torch.bfloat16) if AUTOCAST else contextlib.nullcontext()


def bf16_lora(model: torch.nn.Module) -> None:
    """--autocast: PEFT stops casting LoRA inputs to the adapters' float32, so autocast runs the adapters in bf16."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    for module in model.modules():
        if isinstance(module, BaseTunerLayer):
            setattr(module, "cast_input_dtype_enabled", False)  # noqa: B010 (mypy reads it as a submodule)


def build_base(config: Qwen2Config, dtype: torch.dtype, device: str, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    with torch.device(device):
        model: torch.nn.Module = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def random_batch(n: int, length: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, vocab, size=(n, length + 1))
    return tokens[:, :-1], tokens[:, 1:], np.ones((n, length), dtype=np.float32)


def packed(batch: tuple[np.ndarray, np.ndarray, np.ndarray]) -> PackedBatch:
    inputs, targets, weights = batch
    n, length = inputs.shape
    offsets = np.arange(0, n * length + 1, length, dtype=np.int64)
    loss_inputs = {"target_tokens": targets.reshape(-1).astype(np.int64), "weights": weights.reshape(-1)}
    return PackedBatch(inputs.reshape(-1).astype(np.int64), offsets, loss_inputs)


def synced(fn: Callable[[], Any]) -> Callable[[], Any]:
    def run() -> Any:
        out = fn()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        return out

    return run


def engine_step(engine: TrainingEngine, model_id: str, batches: list[PackedBatch]) -> Callable[[], float]:
    """What a trainer worker runs for forward_backward (one per micro-batch) and optim_step (app.ranks.execute,
    minus Ray)."""

    def step() -> float:
        with autocast():
            loss = sum(engine.forward_backward(model_id, "cross_entropy", {}, b, False).loss_sum for b in batches)
        engine.optim_step(model_id, AdamParams(learning_rate=LR))
        return loss

    return synced(step)


def make_peft(base: torch.nn.Module) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The baseline's PEFT model and AdamW, as a plain PEFT user writes them (same hyper-parameters as ours)."""
    torch.manual_seed(0)
    model = get_peft_model(base, LoraConfig(r=RANK, lora_alpha=int(ALPHA), lora_dropout=0.0, target_modules=TARGETS))
    params = [p for p in model.parameters() if p.requires_grad]
    return model, torch.optim.AdamW(params, lr=LR, betas=(0.9, 0.95), eps=1e-12, weight_decay=0.0, foreach=True)


def peft_step(model: torch.nn.Module, opt: torch.optim.Optimizer, batches: list[tuple], device: str) -> Step:
    """A plain PEFT + AdamW step in this process: the same forward, summed CE loss, backward (per micro-batch,
    gradients accumulating) and step."""
    on_device = [tuple(torch.from_numpy(a).to(device) for a in b) for b in batches]

    def step() -> float:
        total = 0.0
        for inputs, targets, weights in on_device:
            with autocast():
                logits = model(input_ids=inputs).logits.float()
                lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
                loss = -(weights * lp).sum()
            loss.backward()
            total += float(loss.detach())
        opt.step()
        opt.zero_grad(set_to_none=True)
        return total

    return synced(step)


def micro_batches(n: int, length: int, micro: int, vocab: int) -> list[tuple[np.ndarray, np.ndarray, np.ndarray]]:
    inputs, targets, weights = random_batch(n, length, vocab)
    size = n // micro
    return [(inputs[i : i + size], targets[i : i + size], weights[i : i + size]) for i in range(0, n, size)]


def timed(step: Step) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def peak_gib(step: Step) -> float | None:
    """Peak GPU memory allocated during one step, GiB (None on CPU)."""
    if not torch.cuda.is_available():
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    step()
    return torch.cuda.max_memory_allocated() / 2**30


def allocated_gib() -> float | None:
    return torch.cuda.memory_allocated() / 2**30 if torch.cuda.is_available() else None


def try_run(step: Callable[[], Any]) -> tuple[Any, str | None]:
    """(the step's result, None), or (None, the error's first line) if it ran out of GPU memory."""
    try:
        return step(), None
    except torch.OutOfMemoryError as e:
        return None, str(e).split("\n")[0][:200]


def flop_counts(n_mm: int, config: Qwen2Config, n_lora: int, tokens: int, seq: int) -> dict[str, float]:
    attn = (
        12
        * config.num_hidden_layers
        * seq
        * config.num_attention_heads
        * (config.hidden_size // config.num_attention_heads)
    )
    return {"6N": (6 * n_mm + attn) * tokens, "lora": (4 * n_mm + 6 * n_lora + attn) * tokens}


def medians(times: list[list[float]]) -> tuple[float, float, float]:
    """(median of every step, lowest and highest per-round median)."""
    per_round = [statistics.median(r) for r in times]
    return statistics.median([t for r in times for t in r]), min(per_round), max(per_round)


def matmul_tflops(device: str) -> float | None:
    """A large bf16 matrix product's rate on this device: the ceiling MFU's peak stands for."""
    if device != "cuda":
        return None
    a, b = (torch.randn(8192, 8192, device=device, dtype=torch.bfloat16) for _ in range(2))
    for _ in range(3):
        a @ b
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(10):
        a @ b
    torch.cuda.synchronize()
    return 10 * 2 * 8192**3 / (time.perf_counter() - started) / 1e12


def profile_table(step: Step, steps: int, device: str, rows: int) -> tuple[str, str, float, float]:
    """(device-time table, CPU-time table, summed self device time s, wall s) over `steps` profiled steps."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        started = time.perf_counter()
        for _ in range(steps):
            step()
        wall = time.perf_counter() - started
    averages = prof.key_averages()
    sort = "self_cuda_time_total" if device == "cuda" else "self_cpu_time_total"
    device_table = averages.table(sort_by=sort, row_limit=rows, max_name_column_width=60)
    busy = re.search(r"Self CUDA time total: ([0-9.]+)(m?s)", device_table)  # the kernels' summed time
    device_s = float(busy.group(1)) / (1000 if busy.group(2) == "ms" else 1) if busy else 0.0
    cpu_table = averages.table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=60)
    return device_table, cpu_table, device_s, wall


def check_logprobs(device: str, vocab: int) -> dict[str, float]:
    """app.training.logprobs.target_logprobs on bf16 logits against a float64 reference: relative errors of the
    log-probabilities and of the logits' gradient (bf16 storage of the gradient: ~4e-3 expected). Empty for an app/
    without that module."""
    try:
        from app.training.logprobs import target_logprobs
    except ImportError:
        return {}

    gen = torch.Generator().manual_seed(1)
    logits64 = torch.randn(1024, vocab, generator=gen, dtype=torch.float64) * 4
    targets = torch.randint(0, vocab, (1024,), generator=gen)
    weights = torch.randn(1024, generator=gen, dtype=torch.float64)
    x = logits64.to(torch.bfloat16).to(device).requires_grad_(True)
    out = target_logprobs(x, targets.to(device))
    (out * weights.to(device, torch.float32)).sum().backward()
    assert x.grad is not None
    ref_in = x.detach().double().cpu().requires_grad_(True)
    ref = torch.log_softmax(ref_in, -1).gather(1, targets[:, None]).squeeze(1)
    (ref * weights).sum().backward()
    assert ref_in.grad is not None

    def rel(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a.double().cpu() - b).norm() / b.norm())

    return {"logprobs_rel_err": rel(out.detach(), ref.detach()), "grad_rel_err": rel(x.grad, ref_in.grad)}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--shapes", default="8x64,16x512,32x1024,32x1024/4", help="DATUMSxTOKENS[/MICRO_BATCHES],...")
    parser.add_argument("--steps", type=int, default=8, help="timed steps of each per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--models", type=int, default=8, help="LoRA models stepped round robin (0 or 1: skip)")
    parser.add_argument("--multi-shapes", default="8x64,16x512")
    parser.add_argument("--fp32-shapes", default="16x512", help="shapes to time with a float32 base ('' skips)")
    parser.add_argument("--profile-shape", default="16x512", help="'' skips the profile (it runs last)")
    parser.add_argument("--tf32", action="store_true", help="allow TF32 float32 matrix products (PyTorch: off)")
    parser.add_argument(
        "--autocast",
        action="store_true",
        help="an experiment, not what the server does: LoRA in bf16 under autocast (adapters stay float32)",
    )
    parser.add_argument("--peak-tflops", type=float, default=989.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--tiny", action="store_true", help="a 2-layer toy config (a CPU smoke test)")
    parser.add_argument("--out", type=Path, default=None, help="directory for results.json and profile.txt")
    args = parser.parse_args()
    device = args.device
    torch.backends.cuda.matmul.allow_tf32 = args.tf32
    if args.autocast:
        AUTOCAST.append(device)

    def shapes(text: str) -> list[tuple[int, int, int]]:
        out = []
        for item in filter(None, text.split(",")):
            dims, _, micro = item.partition("/")
            n, length = dims.split("x")
            out.append((int(n), int(length), int(micro or 1)))
        return out

    import peft
    import transformers

    config_dict = TINY if args.tiny else QWEN25_05B
    config = Qwen2Config(**config_dict)
    vocab = config.vocab_size
    results: dict[str, Any] = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "peft": peft.__version__,
        "gpu": torch.cuda.get_device_name() if device == "cuda" else None,
        "tf32": args.tf32,
        "autocast": args.autocast,
        "peak_tflops": args.peak_tflops,
        "matmul_bf16_8192_tflops": matmul_tflops(device),
        "logprobs_check": check_logprobs(device, vocab),
        "config": dict(config_dict),
        "shapes": {},
    }
    print(json.dumps({k: v for k, v in results.items() if k not in ("config", "shapes")}), flush=True)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        if args.out:
            (args.out / "results.json").write_text(json.dumps(results, indent=1))

    base_ours = build_base(config, torch.bfloat16, device)
    n_params = sum(p.numel() for p in base_ours.parameters())
    n_mm = sum(m.weight.numel() for m in base_ours.modules() if isinstance(m, torch.nn.Linear))  # LM head included
    engine = TrainingEngine(base_ours, device=device)
    engine.create_model("m0", AdapterSpec(rank=RANK, seed=0, alpha=ALPHA))
    lora = engine._models["m0"].params
    n_lora = sum(p.numel() for p in lora)
    results.update(params=n_params, matmul_params=n_mm, lora_params=n_lora, lora_dtype=str(lora[0].dtype))
    peft_model, peft_opt = make_peft(build_base(config, torch.bfloat16, device))
    if args.autocast:
        bf16_lora(engine.pool.model)
        bf16_lora(peft_model)
    print(f"params {n_params / 1e6:.1f}M, LoRA {n_lora / 1e6:.2f}M ({lora[0].dtype}), device {device}", flush=True)

    for n, length, micro in shapes(args.shapes):
        key = f"{n}x{length}" + (f"/{micro}" if micro > 1 else "")
        raw = micro_batches(n, length, micro, vocab)
        ours = engine_step(engine, "m0", [packed(b) for b in raw])
        theirs = peft_step(peft_model, peft_opt, raw, device)
        row: dict[str, Any] = {"tokens": n * length, "micro_batches": micro}
        # a first step of each; on the first shape both start from B = 0, so both losses are the base model's
        row["loss_ours_first"], oom_ours = try_run(ours)
        free()
        row["loss_peft_first"], oom_peft = try_run(theirs)
        free()
        row.update(oom_ours=oom_ours, oom_peft=oom_peft)
        runnable = [(name, s) for name, s, oom in (("ours", ours, oom_ours), ("peft", theirs, oom_peft)) if not oom]
        for _ in range(args.warmup - 1):
            for _, s in runnable:
                s()
        for name, s in runnable:
            row[f"peak_{name}_gib"] = peak_gib(s)
        times: dict[str, list[list[float]]] = {name: [] for name, _ in runnable}
        for _ in range(args.rounds):
            for name in times:
                times[name].append([])
            for _ in range(args.steps):
                for name, s in runnable:
                    times[name][-1].append(timed(s))
        flops = flop_counts(n_mm, config, n_lora, n * length, length)
        for name, t in times.items():
            med, lo, hi = medians(t)
            row[name] = {"median_s": med, "round_medians_lo_hi": [lo, hi], "all_s": t}
            row[name]["tokens_per_s"] = n * length / med
            row[name]["mfu_6N"] = flops["6N"] / med / (args.peak_tflops * 1e12)
            row[name]["mfu_lora"] = flops["lora"] / med / (args.peak_tflops * 1e12)
        row["flops"] = flops
        if "ours" in times and "peft" in times:
            row["ratio"] = row["ours"]["median_s"] / row["peft"]["median_s"]
        results["shapes"][key] = row
        save()
        del ours, theirs
        free()
        print(json.dumps({key: {k: v for k, v in row.items() if k not in ("ours", "peft", "flops")}}), flush=True)
        for name in times:
            print(f"  {name}: {json.dumps({k: v for k, v in row[name].items() if k != 'all_s'})}", flush=True)

    if args.models > 1:  # one engine: first one live model, then args.models, stepped alone and round robin
        multi: dict[str, Any] = {"models": args.models}
        cases = [(n, length, packed(random_batch(n, length, vocab))) for n, length, _ in shapes(args.multi_shapes)]
        for n, length, batch in cases:
            one = engine_step(engine, "m0", [batch])
            one()
            multi[f"{n}x{length}"] = {"one_live_model_s": medians([[timed(one) for _ in range(args.steps)]])}
        free()
        multi["mem_1_model_gib"] = allocated_gib()
        for i in range(1, args.models):
            engine.create_model(f"m{i}", AdapterSpec(rank=RANK, seed=i, alpha=ALPHA))
        for n, length, batch in cases:
            key = f"{n}x{length}"
            steps = [engine_step(engine, f"m{i}", [batch]) for i in range(args.models)]
            for s in steps:  # every model gets its optimizer state
                s()
            multi["mem_all_models_gib"] = allocated_gib()

            def round_robin(steps: list[Step] = steps) -> None:
                for s in steps:
                    s()

            rr_times: list[list[float]] = []
            one_times: list[list[float]] = []
            for _ in range(args.rounds):
                rr_times.append([timed(round_robin) / args.models for _ in range(max(1, args.steps // 4))])
                one_times.append([timed(steps[0]) for _ in range(args.steps)])
            multi[key].update(
                round_robin_per_step_s=medians(rr_times),
                m0_only_with_all_live_s=medians(one_times),
                peak_round_robin_gib=peak_gib(round_robin),
            )
            print(f"multi {key}: {json.dumps(multi[key])}", flush=True)
        results["multi"] = multi
        print(f"multi memory: {json.dumps({k: v for k, v in multi.items() if k.startswith('mem')})}", flush=True)
        save()
        for i in range(1, args.models):
            engine.remove_model(f"m{i}")
        free()

    if args.fp32_shapes:  # the base in float32: what app.ranks.command_loop loads today
        free()
        engine32 = TrainingEngine(build_base(config, torch.float32, device), device=device)
        engine32.create_model("m0", AdapterSpec(rank=RANK, seed=0, alpha=ALPHA))
        fp32: dict[str, Any] = {}
        for n, length, micro in shapes(args.fp32_shapes):
            for tf32 in (False, True):
                key = f"{n}x{length}" + (" tf32" if tf32 else "")
                torch.backends.cuda.matmul.allow_tf32 = tf32
                s = engine_step(engine32, "m0", [packed(b) for b in micro_batches(n, length, micro, vocab)])
                s()
                s()
                t = [[timed(s) for _ in range(max(3, args.steps // 2))]]
                fp32[key] = {"median_s": medians(t)[0], "all_s": t, "peak_gib": peak_gib(s)}
                print(f"fp32 base {key}: {json.dumps(fp32[key])}", flush=True)
        torch.backends.cuda.matmul.allow_tf32 = args.tf32
        results["fp32_base"] = fp32
        del engine32
        free()
        save()

    if args.profile_shape:  # last: the profiler can leave launches slower after it
        n, length, micro = shapes(args.profile_shape)[0]
        raw = micro_batches(n, length, micro, vocab)
        ours = engine_step(engine, "m0", [packed(b) for b in raw])
        theirs = peft_step(peft_model, peft_opt, raw, device)
        for s in (ours, theirs, ours, theirs):
            s()
        text = []
        for name, s in (("ours", ours), ("peft", theirs)):
            dev_table, cpu_table, dev_s, wall = profile_table(s, 3, device, 30)
            results[f"profile_{name}"] = {"shape": args.profile_shape, "kernels_s": dev_s, "wall_s": wall}
            text.append(f"== {name} {args.profile_shape}: 3 steps, wall {wall:.3f} s, kernels {dev_s:.3f} s\n")
            text.append(f"{dev_table}\n\n{cpu_table}\n\n")
            print(f"\n== profile {name} {args.profile_shape}: 3 steps, wall {wall:.3f} s, kernels {dev_s:.3f} s")
            print("\n".join(dev_table.splitlines()[:16]), flush=True)
        if args.out:
            (args.out / "profile.txt").write_text("".join(text))
        save()

    print(f"\n{results['gpu']}, torch {results['torch']}, bf16 base, LoRA rank {RANK} on {','.join(TARGETS)}")
    print(f"{'shape':>10} {'ours s':>8} {'PEFT s':>8} {'ratio':>6} {'tok/s':>9} {'MFU6N':>6} {'MFUlora':>7} "
          f"{'peak ours/PEFT GiB':>19}")  # fmt: skip
    for key, row in results["shapes"].items():
        o, p = row.get("ours"), row.get("peft")
        cells = [
            f"{o['median_s']:8.4f}" if o else f"{'OOM':>8}",
            f"{p['median_s']:8.4f}" if p else f"{'OOM':>8}",
            f"{row['ratio']:6.2f}" if "ratio" in row else f"{'-':>6}",
            f"{o['tokens_per_s']:9.0f}" if o else f"{'-':>9}",
            f"{o['mfu_6N']:6.1%}" if o else f"{'-':>6}",
            f"{o['mfu_lora']:7.1%}" if o else f"{'-':>7}",
        ]
        mem = f"{row.get('peak_ours_gib') or 0:.1f}/{row.get('peak_peft_gib') or 0:.1f}"
        print(f"{key:>10} {' '.join(cells)} {mem:>19}")


if __name__ == "__main__":
    main()
