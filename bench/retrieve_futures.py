"""Sampling throughput through the SDK with `sample_use_retrieve_futures` on (one retrieve_futures long-poll per
sampling session) and off (one retrieve_future long-poll per sample), against one server, in the same run.

    python bench/retrieve_futures.py [--preset tiny] [--prompts 64] [--new-tokens 32] [--rounds 5]

The server runs with `features.sample_use_retrieve_futures: true` (the default). The "off" client is a second
ServiceClient whose copy of the client config has the flag off, as a server configured with
`features.sample_use_retrieve_futures: false` would send it: the SDK then polls each sample's future itself.
Both clients sample the base model with the same prompts; rounds alternate on / off so machine noise hits
both. Reports tokens/s per round, the medians, and on/off.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import numpy as np
from server import ROOT, start_server  # sets up sys.path and the environment first

from app.models.embedded import build_embedded_model


def sampler_with_flag(url: str, name: str, use_retrieve_futures: bool):
    """A SamplingClient of `name` on its own ServiceClient, whose SDK sees the flag as given."""
    import tinker

    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    holder = service.create_sampling_client(base_model=name).result().holder  # the client config is fetched now
    config = holder.get_client_config()
    assert config.sample_use_retrieve_futures, "the server turns the flag on (features.sample_use_retrieve_futures)"
    holder._client_config = config.model_copy(update={"sample_use_retrieve_futures": use_retrieve_futures})
    return service, service.create_sampling_client(base_model=name).result()


def rate(loop: asyncio.AbstractEventLoop, sampler, batch: list[list[int]], new_tokens: int) -> float:
    """Tokens per second of sampling every prompt of `batch` at once."""
    from tinker import types

    params = types.SamplingParams(max_tokens=new_tokens, stop=[], temperature=1.0)

    async def run() -> int:
        results = await asyncio.gather(*(sampler.sample(types.ModelInput.from_ints(p), 1, params) for p in batch))
        return sum(len(r.sequences[0].tokens) for r in results)

    started = time.perf_counter()
    tokens = loop.run_until_complete(run())
    return tokens / (time.perf_counter() - started)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="tiny", choices=["tiny", "small"])
    parser.add_argument("--prompts", type=int, default=64)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    from transformers import AutoConfig

    path = str(build_embedded_model(args.preset, ROOT / "models" / args.preset))
    name = f"tinker-serve/{args.preset}"
    vocab = AutoConfig.from_pretrained(path).vocab_size
    sampler_cfg = {"num_cpus": 1, "kv_cache_mib": 256, "max_num_seqs": 64, "max_ongoing_requests": 4 * args.prompts}
    base = {"name": name, "path": path, "trainer": {"num_workers": 1, "cpus_per_worker": 1}, "sampler": sampler_cfg}
    url, _ = start_server([base], engine={"max_lora_rank": 8}, features={"sample_use_retrieve_futures": True})
    clients = {flag: sampler_with_flag(url, name, flag) for flag in (True, False)}
    rng = np.random.default_rng(0)
    batch = [rng.integers(3, vocab, size=int(rng.integers(16, 29))).tolist() for _ in range(args.prompts)]
    loop = asyncio.new_event_loop()
    for _, sampler in clients.values():  # warm-up
        rate(loop, sampler, batch[:4], 4)
    print(
        f"\npreset={args.preset}: {args.prompts} concurrent prompts x {args.new_tokens} new tokens, base model; "
        "rounds alternate retrieve_futures on / off",
        flush=True,
    )
    print(f"{'round':>5} {'on tok/s':>9} {'off tok/s':>10}", flush=True)
    rows = []
    for r in range(args.rounds):
        row = tuple(rate(loop, clients[flag][1], batch, args.new_tokens) for flag in (True, False))
        rows.append(row)
        print(f"{r:>5} {row[0]:9.0f} {row[1]:10.0f}", flush=True)
    on, off = (statistics.median(col) for col in zip(*rows))
    print(f"median  on {on:.0f}  off {off:.0f} tok/s;  on/off {on / off:.2f}", flush=True)
    for service, _ in clients.values():
        service.close("success").result()


if __name__ == "__main__":
    main()
