"""The GPU-box profile: what `make serve` serves on a machine with NVIDIA GPUs (or `make serve GPU=1`). It writes this
module's rendering for the machine's GPUs and MODEL to state/serve_config.gpu-box.yaml and serves it as the CPU
default is served (direct ingress on 127.0.0.1:8000, SQLite and checkpoints under state/, any `tml-` key on
loopback). deploy/serve_config.one-gpu.yaml is the one-GPU rendering for DEFAULT_MODEL, committed to read (a test
keeps it current).

How the GPUs are split (`split`; docs/guides/clusters-and-gpus.md, "One GPU box"):

- One GPU, shared. The policy trainer's one rank reserves half of it in Ray (gpus_per_worker 0.5) and its torch
  holds at most half its memory (gpu_memory_fraction 0.5); the Sampler's one replica reserves the other half
  (num_gpus 0.5) and vLLM takes 0.4 of its memory (gpu_memory_utilization: weights, activations, CUDA graphs, KV
  cache). The last tenth is for what neither counts: each process's CUDA context. vLLM starts once the trainer is up
  (it profiles the device's free memory; BaseModelConfig.sampler_starts_after_trainer). Critics train in the policy
  group. The context is capped (ONE_GPU_CONTEXT): vLLM refuses to start unless its share holds one whole context.
- N >= 2 GPUs, whole. The trainer's group takes floor(N/2) ranks, a GPU each (data parallel, the base sharded across
  them when it is larger than 512 MiB); the Sampler N - floor(N/2) replicas, a GPU each, vLLM taking 0.85 of it, all
  kept up (the box's GPUs are there anyway). Sampling gets the odd GPU: RL spends more time sampling than training.

    python -m deployments.gpu_box --model Qwen/Qwen3-8B --download --out state/serve_config.gpu-box.yaml
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

DEFAULT_MODEL = "Qwen/Qwen3-0.6B"
ONE_GPU_CONTEXT = 16384  # vLLM's 0.4 of a 16 GB GPU holds it for the 0.6B (1.8 GiB of KV cache); 8B on 80 GB too
# what a model's snapshot needs here: weights, config, tokenizer, chat template (no .bin or .pth twins)
DOWNLOAD_PATTERNS = ["*.json", "*.safetensors", "*.txt", "*.model", "*.tiktoken", "*.jinja"]


@dataclass(frozen=True)
class Split:
    """How a box's GPUs are shared out between the policy trainer's ranks and the Sampler's replicas."""

    trainer_workers: int
    gpus_per_worker: float
    gpu_memory_fraction: float | None  # the ranks' torch cap; None: their GPU is their own
    sampler_replicas: int
    sampler_gpus: float  # per replica
    gpu_memory_utilization: float  # vLLM's share of its GPU's memory

    @property
    def shared(self) -> bool:
        return self.gpus_per_worker < 1

    @property
    def gpus(self) -> float:
        """The GPUs the trainer and every Sampler replica reserve together."""
        return self.trainer_workers * self.gpus_per_worker + self.sampler_replicas * self.sampler_gpus


def split(gpus: int) -> Split:
    """One GPU: trainer and sampler half each; more: floor(N/2) whole GPUs train, the rest sample (module doc)."""
    if gpus < 1:
        raise ValueError(f"a GPU box has at least one GPU, not {gpus}")
    if gpus == 1:
        return Split(1, 0.5, 0.5, 1, 0.5, 0.4)
    return Split(gpus // 2, 1.0, None, gpus - gpus // 2, 1.0, 0.85)


def visible_gpus(environ: dict[str, str] | None = None) -> int:
    """The NVIDIA GPUs this machine's Ray will see: CUDA_VISIBLE_DEVICES's when set, else what `nvidia-smi -L` lists
    (0 without the tool)."""
    environ = dict(os.environ) if environ is None else environ
    visible = environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and not d.strip().startswith("-")])
    if shutil.which("nvidia-smi") is None:
        return 0
    listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, check=False)
    return sum(line.startswith("GPU ") for line in listed.stdout.splitlines()) if listed.returncode == 0 else 0


def served_name(model: str) -> str:
    """What clients pass as base_model: the Hugging Face id, or a local directory's name."""
    return Path(model).name if Path(model).is_dir() else model


def profile(model: str = DEFAULT_MODEL, gpus: int = 1, max_context_length: int | None = None) -> dict[str, Any]:
    """The serve config for a box of `gpus` GPUs serving `model` (a Hugging Face id or a local directory), shaped as
    the CPU default (serve_config.yaml). max_context_length: None is ONE_GPU_CONTEXT on one GPU, the model's whole
    context on more."""
    s = split(gpus)
    context = max_context_length or (ONE_GPU_CONTEXT if s.shared else None)
    trainer: dict[str, Any] = {"num_workers": s.trainer_workers, "use_gpu": True}
    if s.shared:
        trainer |= {"gpus_per_worker": s.gpus_per_worker, "gpu_memory_fraction": s.gpu_memory_fraction}
    trainer |= {"cpus_per_worker": 1, "torch_threads_per_worker": 2}
    base: dict[str, Any] = {"name": served_name(model), "path": model}
    if context is not None:
        base["max_context_length"] = context
    base |= {
        "trainer": trainer,  # policies and critics
        "sampler": {
            "min_replicas": s.sampler_replicas,
            "max_replicas": s.sampler_replicas,
            "target_ongoing_requests": 32,
            "max_ongoing_requests": 256,
            "num_cpus": 1,
            "num_gpus": s.sampler_gpus,
            "gpu_memory_utilization": s.gpu_memory_utilization,
            "max_loras": 4,
            "max_cpu_loras": 16,
            "max_num_seqs": 256,
            "enforce_eager": False,  # CUDA graphs
        },
    }
    return {
        "proxy_location": "HeadOnly",
        "http_options": {"host": "127.0.0.1", "port": 8001},  # the proxy, a fallback: see serve_config.yaml
        "applications": [
            {
                "name": "tinker",
                "route_prefix": "/",
                "import_path": "deployments.builder:build_app",
                "args": {"state_dir": "state", "auth": {"mode": "any_tml_key_on_loopback"}, "base_models": [base]},
            }
        ],
    }


def profile_text(model: str = DEFAULT_MODEL, gpus: int = 1, max_context_length: int | None = None) -> str:
    """`profile` as YAML under a comment block that says how the GPUs are split."""
    s = split(gpus)
    if s.shared:
        how = (
            "One GPU, shared: the trainer's one rank reserves half of it in Ray (gpus_per_worker) and its torch holds "
            "at most half its memory (gpu_memory_fraction); the Sampler's replica reserves the other half (num_gpus) "
            "and vLLM takes 0.4 of the memory (gpu_memory_utilization: weights, activations, CUDA graphs, KV cache). "
            "The last tenth is for each process's CUDA context. vLLM starts once the trainer is up. "
            "max_context_length: vLLM's share must hold one whole context (raise it on a large GPU)."
        )
    else:
        how = (
            f"{gpus} GPUs, whole: {s.trainer_workers} train (one rank each, NCCL; the base sharded across them when "
            f"over 512 MiB), {s.sampler_replicas} sample (one vLLM replica each, all kept up)."
        )
    header = (
        f"GENERATED by deployments/gpu_box.py for {gpus} GPU{'s' if gpus > 1 else ''} and {model}. make serve on a "
        "machine with NVIDIA GPUs writes the rendering for that machine (state/serve_config.gpu-box.yaml) and serves "
        "it, on 127.0.0.1:8000; make serve GPU=1 MODEL=<Hugging Face id> serves another model. "
        "docs/guides/clusters-and-gpus.md, One GPU box."
    )
    lines = [*textwrap.wrap(header, 116), *textwrap.wrap(how, 116)]
    body = yaml.safe_dump(profile(model, gpus, max_context_length), sort_keys=False)
    return "".join(f"# {line}\n" for line in lines) + body


def download(model: str) -> Path:
    """The model's snapshot in the Hugging Face cache (fetched when missing; the server then runs offline)."""
    if Path(model).is_dir():
        return Path(model)
    from huggingface_hub import snapshot_download

    return Path(snapshot_download(model, allow_patterns=DOWNLOAD_PATTERNS))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the GPU-box serve config for this machine's GPUs.")
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"a Hugging Face id or a directory ({DEFAULT_MODEL})")
    parser.add_argument("--gpus", type=int, help="GPUs to use (default: what CUDA_VISIBLE_DEVICES or nvidia-smi shows)")
    parser.add_argument("--max-context-length", type=int, help=f"one GPU: {ONE_GPU_CONTEXT}; more: the model's")
    parser.add_argument("--download", action="store_true", help="fetch the model into the Hugging Face cache first")
    parser.add_argument("--out", type=Path, help="write here (default: print)")
    args = parser.parse_args(argv)
    gpus = args.gpus if args.gpus is not None else visible_gpus()
    if gpus < 1:
        print("no NVIDIA GPU found (nvidia-smi -L lists none): pass --gpus N (make serve GPUS=N)", file=sys.stderr)
        return 2
    text = profile_text(args.model, gpus, args.max_context_length)
    if args.download:
        print(f"{args.model}: {download(args.model)}", file=sys.stderr)
    if args.out is None:
        print(text, end="")
    else:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text)
        print(f"wrote {args.out}: {split(gpus)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
