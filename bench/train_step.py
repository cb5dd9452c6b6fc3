"""Train-step benchmark: forward_backward + optim_step through the SDK and the Serve app, against the
same computation in a plain in-process PyTorch/PEFT loop measured in the same run.

    python bench/train_step.py [--preset small] [--shapes 16x256,8x64] [--steps 6]

Prints seconds per step for both and the ratio (goal: <= 1.10 at small, 16 x 256).
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TINKER_TELEMETRY", "0")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from peft import LoraConfig, get_peft_model  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from app.models.embedded import build_embedded_model  # noqa: E402

RANK, LR = 32, 1e-4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]


def random_batch(n: int, length: int, vocab: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(3, vocab, size=(n, length + 1))
    return tokens[:, :-1], tokens[:, 1:], np.ones((n, length), dtype=np.float32)


def baseline_seconds(path: Path, batch: tuple, steps: int, threads: int) -> float:
    """A plain PEFT + AdamW loop in this process: the same forward, summed CE loss, backward and step."""
    torch.set_num_threads(threads)
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                           LoraConfig(r=RANK, lora_alpha=32, target_modules=TARGETS))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=LR, betas=(0.9, 0.95), eps=1e-12)
    inputs, targets, weights = (torch.from_numpy(a) for a in batch)
    times = []
    for i in range(steps + 2):
        started = time.perf_counter()
        logits = model(input_ids=inputs).logits.float()
        lp = torch.log_softmax(logits, -1).gather(-1, targets[..., None]).squeeze(-1)
        (-(weights * lp).sum()).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i >= 2:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


def start_server(path: Path, name: str, workers: int) -> str:
    import httpx
    import ray
    from ray import serve

    from deployments.builder import build_app

    ray.init(num_cpus=8, include_dashboard=False, log_to_driver=False, _temp_dir=f"/tmp/tsbench-{os.getpid()}")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    config = {"state_dir": tempfile.mkdtemp(prefix="tsbench-"), "auth": {"mode": "any_tml_key_on_loopback"},
              "base_models": [{"name": name, "path": str(path), "num_workers": workers, "cpus_per_worker": 1}]}
    serve.run(build_app(config), name="bench", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    while httpx.get(f"{url}/ready", timeout=10).status_code != 200:
        time.sleep(1)
    return url


def server_seconds(client, name: str, batch: tuple, steps: int) -> float:
    from tinker import types

    tc = client.create_lora_training_client(base_model=name, rank=RANK, seed=0).result()
    inputs, targets, weights = batch
    data = [types.Datum(model_input=types.ModelInput.from_ints(inputs[i].tolist()),
                        loss_fn_inputs={"target_tokens": targets[i].tolist(), "weights": weights[i].tolist()})
            for i in range(len(inputs))]
    times = []
    for i in range(steps + 2):
        started = time.perf_counter()
        fb = tc.forward_backward(data, "cross_entropy")
        opt = tc.optim_step(types.AdamParams(learning_rate=LR))
        fb.result(), opt.result()
        if i >= 2:
            times.append(time.perf_counter() - started)
    return statistics.median(times)


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
    batches = {shape: random_batch(*shape, vocab) for shape in shapes}
    base = {shape: baseline_seconds(path, batches[shape], args.steps, threads=args.workers) for shape in shapes}
    url = start_server(path, name, args.workers)
    client = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    served = {shape: server_seconds(client, name, batches[shape], args.steps) for shape in shapes}
    print(f"\npreset={args.preset} LoRA rank {RANK} on all linear layers + lm_head; median of {args.steps} steps "
          f"after 2 warm-up; server: {args.workers} data-parallel TorchTrainer workers x 1 thread; baseline: "
          f"one process x {args.workers} threads")
    print(f"{'shape':>10} {'baseline s/step':>16} {'server s/step':>14} {'ratio':>7}")
    for shape in shapes:
        print(f"{shape[0]:>4}x{shape[1]:<5} {base[shape]:16.3f} {served[shape]:14.3f} {served[shape] / base[shape]:7.2f}")
    client.close("success").result()


if __name__ == "__main__":
    main()
