"""Train-step benchmark: forward_backward + optim_step through the SDK and the Serve app, against the
same computation in a plain in-process PyTorch/PEFT loop measured in the same run.

    python bench/train_step.py [--preset small] [--shapes 16x256,8x64] [--steps 6]

Prints the median seconds per step of each and their ratio (goal: <= 1.10 at small, 16 x 256).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from server import ROOT, start_server  # sets up sys.path and the environment first
from transformers import AutoModelForCausalLM

from app.models.embedded import build_embedded_model

RANK, LR = 32, 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]  # as the server adapts


def random_batch(n: int, length: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, vocab, size=(n, length + 1))
    return tokens[:, :-1], tokens[:, 1:], np.ones((n, length), dtype=np.float32)


def baseline_step(path: Path, batch: tuple, threads: int):
    """A plain PEFT + AdamW loop in this process: the same forward, summed CE loss, backward and step."""
    torch.set_num_threads(threads)
    model = get_peft_model(
        AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        LoraConfig(r=RANK, lora_alpha=32, target_modules=TARGETS),
    )
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, betas=(0.9, 0.95), eps=1e-12)
    inputs, targets, weights = (torch.from_numpy(a) for a in batch)

    def step() -> None:
        logits = model(input_ids=inputs).logits.float()
        lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
        (-(weights * lp).sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def server_step(client, name: str, batch: tuple):
    """forward_backward + optim_step through the SDK, pipelined as the cookbook does, both awaited."""
    from tinker import types

    tc = client.create_lora_training_client(base_model=name, rank=RANK, seed=0).result()
    inputs, targets, weights = batch
    data = [
        types.Datum(
            model_input=types.ModelInput.from_ints(inputs[i].tolist()),
            loss_fn_inputs={"target_tokens": targets[i].tolist(), "weights": weights[i].tolist()},
        )
        for i in range(len(inputs))
    ]

    def step() -> None:
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=LR))
        fb.result(), opt.result()

    return step


def timed(step) -> float:
    started = time.perf_counter()
    step()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--shapes", default="16x256,8x64", help="comma list of DATUMSxTOKENS")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    import tinker

    path = build_embedded_model(args.preset, ROOT / "models" / args.preset)
    vocab = AutoModelForCausalLM.from_pretrained(path).config.vocab_size
    name = f"tinker-serve/{args.preset}"
    shapes = [tuple(int(x) for x in s.split("x")) for s in args.shapes.split(",")]
    url, _ = start_server(
        [{"name": name, "path": str(path), "trainer": {"num_workers": args.workers, "cpus_per_worker": 1}}]
    )
    client = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    print(
        f"\npreset={args.preset} LoRA rank {RANK} on all linear layers; server: {args.workers} "
        f"data-parallel TorchTrainer workers x 1 thread; baseline: one process x {args.workers} threads; "
        f"steps alternate baseline/server ({args.steps} each after 2 warm-up) so machine noise hits both"
    )
    print(f"{'shape':>10} {'baseline s/step':>16} {'server s/step':>14} {'ratio':>7}", flush=True)
    for shape in shapes:
        batch = random_batch(*shape, vocab)
        base, served = baseline_step(path, batch, threads=args.workers), server_step(client, name, batch)
        for _ in range(2):
            base(), served()
        pairs = [(timed(base), timed(served)) for _ in range(args.steps)]
        b, s_ = statistics.median(p[0] for p in pairs), statistics.median(p[1] for p in pairs)
        print(f"{shape[0]:>4}x{shape[1]:<5} {b:16.3f} {s_:14.3f} {s_ / b:7.2f}", flush=True)
    client.close("success").result()


if __name__ == "__main__":
    main()
