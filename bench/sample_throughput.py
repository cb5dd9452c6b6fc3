"""Sampling benchmark: tokens/s through the SDK and the Serve app, against vLLM's engine in this process
and HF `generate`, measured in the same run; then the save -> first-token latency and autoscaling.

    python bench/sample_throughput.py [--preset small] [--prompts 32] [--new-tokens 64] [--rounds 3]

Every path samples the same adapter (trained one step) with per-token logprobs and runs to exactly
`--new-tokens` tokens, single-threaded (the Sampler replica has one CPU); both vLLM engines use
max_lora_rank 8 (on CPU, vLLM's LoRA cost grows with it: 32 halves the rate, 128 quarters it again).
Rounds alternate HF / vLLM / SDK so machine noise hits all three. Goal: SDK / raw vLLM >= 0.90;
save -> first token < 1 s on tiny.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
import uuid

from server import APP_NAME, ROOT, start_server  # sets up sys.path and the environment first

from app.sampling.cpu_env import CPU_ENGINE_ENV

# before torch and vLLM read it: the in-process engine runs as the replica's does (a variable already set wins)
os.environ.update({"OMP_NUM_THREADS": "1", **CPU_ENGINE_ENV, **os.environ})

import numpy as np
import torch

from app.models.embedded import build_embedded_model
from tests.integration.helpers import stored_directory

RANK = 8
KV_CACHE_MIB = 256


def prompts(n: int, vocab: int, seed: int = 0) -> list[list[int]]:
    rng = np.random.default_rng(seed)
    return [rng.integers(3, vocab, size=int(rng.integers(16, 29))).tolist() for _ in range(n)]


def hf_generate(path: str, adapter_dir: str, batch: list[list[int]], new_tokens: int):
    """HF + PEFT `generate` on the left-padded batch, with the sampled tokens' logprobs."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(1)
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32), adapter_dir)
    width = max(map(len, batch))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in batch])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in batch])

    def run() -> int:
        with torch.no_grad():
            out = model.generate(
                input_ids=ids,
                attention_mask=mask,
                do_sample=True,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                pad_token_id=0,
                return_dict_in_generate=True,
                output_logits=True,
            )
            model.compute_transition_scores(out.sequences, out.logits, normalize_logits=True)
        return (out.sequences.shape[1] - width) * len(batch)

    return run


async def raw_engine(path: str, adapter_dir: str, max_model_len: int):
    """vLLM's AsyncLLM in this process with the replica's settings (LoRA on, eager, fp32)."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.lora.request import LoRARequest
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(
        AsyncEngineArgs(
            model=path,
            dtype="float32",
            max_model_len=max_model_len,
            enforce_eager=True,
            enable_lora=True,
            max_lora_rank=RANK,
            max_loras=4,
            max_num_seqs=64,
            kv_cache_memory_bytes=KV_CACHE_MIB * 2**20,
        )
    )
    lora = LoRARequest("bench", 1, adapter_dir)

    async def one(prompt: list[int], new_tokens: int) -> int:
        params = SamplingParams(
            max_tokens=new_tokens,
            ignore_eos=True,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        async for out in llm.generate({"prompt_token_ids": prompt}, params, uuid.uuid4().hex, lora_request=lora):
            final = out
        return len(final.outputs[0].token_ids)

    async def run(batch: list[list[int]], new_tokens: int) -> int:
        return sum(await asyncio.gather(*(one(p, new_tokens) for p in batch)))

    return llm, run


def sdk_sampler(sampler):
    from tinker import types

    async def run(batch: list[list[int]], new_tokens: int) -> int:
        params = types.SamplingParams(max_tokens=new_tokens, stop=[], temperature=1.0)
        results = await asyncio.gather(*(sampler.sample_async(types.ModelInput.from_ints(p), 1, params) for p in batch))
        return sum(len(r.sequences[0].tokens) for r in results)

    return run


def rate(loop: asyncio.AbstractEventLoop, run, *args) -> float:
    """Tokens per second of one call of `run` (a plain or an async function)."""
    started = time.perf_counter()
    tokens = loop.run_until_complete(run(*args)) if asyncio.iscoroutinefunction(run) else run(*args)
    return tokens / (time.perf_counter() - started)


def trained_client(service, name: str, tokens: list[int]):
    from tinker import types

    tc = service.create_lora_training_client(base_model=name, rank=RANK, seed=0).result()
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    tc.forward_backward([datum], "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    return tc, datum


def save_to_first_token(tc, datum, repeats: int) -> list[float]:
    """Seconds from save_weights_and_get_sampling_client to the first sampled token, after a training step."""
    from tinker import types

    times = []
    for _ in range(repeats):
        tc.forward_backward([datum], "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        started = time.perf_counter()
        sampler = tc.save_weights_and_get_sampling_client().result()
        sampler.sample(datum.model_input, 1, types.SamplingParams(max_tokens=1)).result()
        times.append(time.perf_counter() - started)
    return times


def replica_states(deployment: str) -> dict[str, int]:
    from ray import serve

    status = serve.status().applications[APP_NAME].deployments[deployment]
    return {str(state): count for state, count in status.replica_states.items() if count}


async def scaling_demo(sampler, deployment: str, vocab: int, concurrency: int, max_load_s: float) -> None:
    """Hold `concurrency` requests in flight until a second replica runs (or max_load_s), then go idle."""
    from tinker import types

    print(f"\nautoscaling: before load {replica_states(deployment)}", flush=True)
    params = types.SamplingParams(max_tokens=32, stop=[])
    stop_at = time.monotonic() + max_load_s
    batch = prompts(concurrency, vocab, seed=7)
    scaled_at = None
    in_flight = {asyncio.ensure_future(sampler.sample_async(types.ModelInput.from_ints(p), 1, params)) for p in batch}
    started = time.monotonic()
    while time.monotonic() < stop_at and scaled_at is None:
        done, in_flight = await asyncio.wait(in_flight, timeout=1.0)
        in_flight |= {
            asyncio.ensure_future(sampler.sample_async(types.ModelInput.from_ints(batch[0]), 1, params)) for _ in done
        }
        if replica_states(deployment).get("RUNNING", 0) >= 2:
            scaled_at = time.monotonic() - started
    print(
        f"autoscaling: under load ({concurrency} in flight) {replica_states(deployment)}; "
        f"second replica running after {scaled_at:.0f} s"
        if scaled_at
        else f"autoscaling: no second replica within {max_load_s:.0f} s: {replica_states(deployment)}",
        flush=True,
    )
    await asyncio.gather(*in_flight)
    idle_since = time.monotonic()
    # polls Serve's replica states: there is no event to wait on
    while replica_states(deployment).get("RUNNING", 0) > 1 and time.monotonic() - idle_since < 180:  # noqa: ASYNC110
        await asyncio.sleep(2)
    print(
        f"autoscaling: {time.monotonic() - idle_since:.0f} s after the load ended {replica_states(deployment)}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="small", choices=["tiny", "small"])
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--skip-scaling", action="store_true")
    args = parser.parse_args()
    import tinker
    from transformers import AutoConfig

    paths = {p: build_embedded_model(p, ROOT / "models" / p) for p in {args.preset, "tiny"}}
    name, path = f"tinker-serve/{args.preset}", str(paths[args.preset])
    vocab = AutoConfig.from_pretrained(path).vocab_size
    sampler_cfg = {
        "min_replicas": 1,
        "max_replicas": 2,
        "target_ongoing_requests": 2 * args.prompts,
        "max_ongoing_requests": 4 * args.prompts,
        "num_cpus": 1,
        "kv_cache_mib": KV_CACHE_MIB,
        "max_num_seqs": 64,
    }
    bases = [{"name": name, "path": path, "trainer": {"num_workers": 1, "cpus_per_worker": 1}, "sampler": sampler_cfg}]
    if args.preset != "tiny":
        bases.append(
            {
                "name": "tinker-serve/tiny",
                "path": str(paths["tiny"]),
                "trainer": {"num_workers": 1, "cpus_per_worker": 1},
                "sampler": {"kv_cache_mib": 64},
            }
        )
    url, state_dir = start_server(bases, engine={"max_lora_rank": RANK})  # the raw engine's LoRA width too
    service = tinker.ServiceClient(base_url=url, api_key="tml-bench")
    batch = prompts(args.prompts, vocab)
    tc, _ = trained_client(service, name, batch[0])
    adapter_path = tc.save_weights_for_sampler("bench").result().path
    adapter_dir = str(stored_directory(state_dir, adapter_path))
    sdk = sdk_sampler(service.create_sampling_client(model_path=adapter_path).result())
    loop = asyncio.new_event_loop()
    llm, raw = loop.run_until_complete(raw_engine(path, adapter_dir, max_model_len=2048))
    hf = hf_generate(path, adapter_dir, batch, args.new_tokens)
    for run in (hf, raw, sdk):  # warm-up
        rate(loop, run, *(() if run is hf else (batch[:4], 4)))
    print(
        f"\npreset={args.preset}: {args.prompts} concurrent prompts x {args.new_tokens} new tokens, LoRA rank "
        f"{RANK}, sampled-token logprobs, 1 thread each; rounds alternate HF / vLLM / SDK",
        flush=True,
    )
    print(f"{'round':>5} {'HF tok/s':>9} {'vLLM tok/s':>11} {'SDK tok/s':>10}", flush=True)
    rates = []
    for r in range(args.rounds):
        row = (rate(loop, hf), rate(loop, raw, batch, args.new_tokens), rate(loop, sdk, batch, args.new_tokens))
        rates.append(row)
        print(f"{r:>5} {row[0]:9.0f} {row[1]:11.0f} {row[2]:10.0f}", flush=True)
    h, v, s = (statistics.median(col) for col in zip(*rates))
    print(
        f"median  HF {h:.0f}  vLLM {v:.0f}  SDK {s:.0f} tok/s;  SDK/vLLM {s / v:.2f} (goal >= 0.90)  "
        f"vLLM/HF {v / h:.2f}  SDK/HF {s / h:.2f}",
        flush=True,
    )
    llm.shutdown()

    tiny_tc, tiny_datum = trained_client(service, "tinker-serve/tiny", batch[1][:12])
    latencies = save_to_first_token(tiny_tc, tiny_datum, repeats=5)
    print(
        f"\nsave_weights_and_get_sampling_client -> first token (tiny): median {statistics.median(latencies):.3f} s, "
        f"all {[round(x, 3) for x in latencies]} (goal < 1 s)",
        flush=True,
    )
    if not args.skip_scaling:
        sampler = service.create_sampling_client(model_path=adapter_path).result()
        loop.run_until_complete(
            scaling_demo(sampler, f"Sampler:{name}", vocab, concurrency=4 * args.prompts, max_load_s=180)
        )
    service.close("success").result()


if __name__ == "__main__":
    main()
