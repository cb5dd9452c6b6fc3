"""A realistic base through the whole server, as a user runs it: `serve run` on serve_config.yaml with the embedded
model swapped for the Qwen3-0.6B-shaped preset (0.44B parameters; built offline on first start; `--preset small` for
the 14M one), the trainer's defaults (dtype auto, the base sharded across 2 workers with FSDP2, activation
checkpointing) and a KV cache for the longest context. The real tinker SDK trains a rank-32 LoRA at 2 x 1024 and
1 x 8192 tokens per step, then samples with the trained adapter and compares the sampler's logprobs with the
trainer's.

    python bench/serve_scale.py [--shapes 2x1024,1x8192] [--steps 2] [--sequence-parallel 2,1] [--preset qwen3-0.6b]
        [--no-sample] [--scratch /tmp/tinker-serve-scale]

`--sequence-parallel` lists trainer.sequence_parallel settings to compare, one server start each, in the order given
(1: every datum runs whole on one rank, as before sequence parallelism; 2: a datum over 4,096 tokens is split across
both ranks). Per setting and shape it prints the seconds of each step (forward_backward + optim_step, as the SDK sees
them), each training worker's peak resident memory during that shape (VmHWM, reset between shapes) and the CPU
seconds each worker spent on it (both ranks busy, or one); at the end, each shape's median step time and peaks
against the first setting's (ratios of the same run), the sampling time, the logprob agreement, and the peak memory
of every process of the server.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from peer_compare import ROOT, free_port, log, our_processes, serve_run, stop, wait_for

sys.path.insert(0, str(ROOT))
from tests.integration.helpers import random_datums  # after the repo root is on the path

NAME = "tinker-serve/qwen3-0.6b"


def config(run: Path, context: int, preset: str, sequence_parallel: int) -> dict[str, Any]:
    """The repo's serve_config.yaml with the `preset`-shaped base, the trainer at its defaults (the yaml's tiny-model
    overrides dropped) but `sequence_parallel`, and a CPU KV cache that holds one `context`-token sequence."""
    from app.models.embedded import PRESETS

    text = yaml.safe_load((ROOT / "serve_config.yaml").read_text())
    args = text["applications"][0]["args"]
    base = args["base_models"][0]
    base.update(name=NAME, path=str(ROOT / "models" / preset), embedded_preset=preset)
    base["trainer"] = {k: v for k, v in base["trainer"].items() if k in ("num_workers", "cpus_per_worker")}
    base["trainer"]["sequence_parallel"] = sequence_parallel
    base["max_context_length"] = context
    shape = PRESETS[preset]
    head_dim = shape.head_dim or shape.hidden_size // shape.num_attention_heads
    token_bytes = 2 * shape.num_hidden_layers * shape.num_key_value_heads * head_dim * 2  # keys and values, bf16
    base["sampler"].update(kv_cache_mib=context * token_bytes // 2**20 + 64, max_replicas=1)
    args["state_dir"] = str(run / "state")
    args.setdefault("limits", {})["max_tokens_per_datum"] = context
    # a 0.6B step of 16,384 tokens on one rank of a 2-core VM takes over the default 900 s
    args.setdefault("timeouts", {})["command_timeout_seconds"] = 4 * 3600
    return text


def status_kib(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0


def title(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:80]


def workers(pids: list[int]) -> list[int]:
    return sorted(p for p in pids if "RayTrainWorker" in title(p))


def reset_peaks(pids: list[int]) -> None:
    for pid in pids:
        Path(f"/proc/{pid}/clear_refs").write_text("5")


def cpu_seconds(pid: int) -> float:
    """The process's user + system CPU time so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="2x1024,1x8192")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--sequence-parallel", default="2", help="settings to compare, one server start each")
    parser.add_argument("--preset", default="qwen3-0.6b")
    parser.add_argument("--no-sample", action="store_true", help="skip the sampling check after training")
    parser.add_argument("--scratch", type=Path, default=Path("/tmp/tinker-serve-scale"))
    args = parser.parse_args()
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    settings = [int(x) for x in args.sequence_parallel.split(",")]
    root = args.scratch / time.strftime("%Y%m%d-%H%M%S")
    results = {}
    for i, setting in enumerate(settings):
        run = root / f"sequence_parallel_{setting}"
        run.mkdir(parents=True)
        results[setting] = one_server(
            run, shapes, args.steps, args.preset, setting, sample=i == 0 and not args.no_sample
        )
        (root / "result.json").write_text(json.dumps(results, indent=2))
    first = results[settings[0]]["shapes"]
    for setting in settings[1:]:
        for shape, figures in results[setting]["shapes"].items():
            ratio = statistics.median(figures["steps_s"]) / statistics.median(first[shape]["steps_s"])
            peaks = max(figures["peak_gib_per_rank"]) / max(first[shape]["peak_gib_per_rank"])
            log(
                f"{shape}: sequence_parallel {setting} vs {settings[0]}: step time x{ratio:.2f}, "
                f"largest rank peak x{peaks:.2f}"
            )
    print(json.dumps(results, indent=2))


def one_server(
    run: Path, shapes: list[tuple[int, int]], steps: int, preset: str, sequence_parallel: int, sample: bool
) -> dict[str, Any]:
    """Start the server with this trainer.sequence_parallel, train the shapes, optionally sample; its figures."""
    context = max(t for _, t in shapes) + 256
    ray_tmp = Path("/tmp") / f"tss-{os.getpid()}-{sequence_parallel}"
    port = free_port()
    started = time.time()
    proc = serve_run(config(run, context, preset, sequence_parallel), port, run, ray_tmp)
    result: dict[str, Any] = {"shapes": {}}
    try:
        import tinker
        from tinker import types

        url = f"http://127.0.0.1:{port}"
        wait_for(f"{url}/api/v1/healthz", proc, 900)
        sc = tinker.ServiceClient(base_url=url, api_key="tml-bench")
        tc = sc.create_lora_training_client(base_model=NAME, rank=32, seed=0).result()
        result["launch_to_model_s"] = round(time.time() - started, 1)
        log(f"sequence_parallel {sequence_parallel}: model created {result['launch_to_model_s']} s after launch")
        ranks = workers(list(our_processes(proc.pid, str(ray_tmp))))
        for n, length in shapes:
            reset_peaks(ranks)
            cpu_before = [cpu_seconds(p) for p in ranks]
            times, losses = [], []
            for step in range(steps):
                t0 = time.time()
                fb = tc.forward_backward(random_datums(n, length, seed=step), "cross_entropy")
                opt = tc.optim_step(types.AdamParams(learning_rate=1e-4))
                losses.append(fb.result().metrics["loss:sum"] / (n * length))
                opt.result()
                times.append(round(time.time() - t0, 1))
                log(
                    f"sequence_parallel {sequence_parallel}, {n}x{length} step {step}: {times[-1]} s, "
                    f"mean loss {losses[-1]:.4f}"
                )
            peaks = [round(status_kib(p, "VmHWM") / 2**20, 2) for p in ranks]
            cpu = [round(cpu_seconds(p) - before, 1) for p, before in zip(ranks, cpu_before, strict=True)]
            result["shapes"][f"{n}x{length}"] = {
                "steps_s": times,
                "mean_loss": losses,
                "peak_gib_per_rank": peaks,
                "cpu_s_per_rank": cpu,
            }
            log(f"  peaks {peaks} GiB, CPU seconds per rank {cpu}")
        if sample:
            result.update(sample_check(tc))
        processes = our_processes(proc.pid, str(ray_tmp))
        result["peak_gib_by_process"] = sorted(
            ((title(p)[:50], round(status_kib(p, "VmHWM") / 2**20, 2)) for p in processes if status_kib(p, "VmHWM")),
            key=lambda item: -item[1],
        )[:8]
    finally:
        stop(proc, signal.SIGINT, 60, str(ray_tmp))
    (run / "result.json").write_text(json.dumps(result, indent=2))
    return result


def sample_check(tc: Any) -> dict[str, Any]:
    """Sample with the trained adapter; the time and the sampler's logprobs against the trainer's."""
    from tinker import types

    t0 = time.time()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = random_datums(1, 16, seed=99)[0].model_input.to_ints()
    sample = sampler.sample(types.ModelInput.from_ints(prompt), 2, types.SamplingParams(max_tokens=32, seed=1))
    sequences = sample.result().sequences
    result: dict[str, Any] = {"sample_s": round(time.time() - t0, 1)}
    worst = 0.0
    for seq in sequences:
        tokens = prompt + seq.tokens
        datum = types.Datum(
            model_input=types.ModelInput.from_ints(tokens[:-1]),
            loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
        )
        trained = tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()
        worst = max(worst, float(np.abs(np.asarray(seq.logprobs) - trained[-len(seq.tokens) :]).max()))
    result["sampled_tokens"] = sum(len(s.tokens) for s in sequences)
    result["max_dlogprob_sampler_vs_trainer"] = round(worst, 4)
    return result


if __name__ == "__main__":
    main()
