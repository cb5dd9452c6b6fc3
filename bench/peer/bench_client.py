#!/usr/bin/env python3
# ruff: noqa
# fmt: off
# Copied unchanged from the team's shared peer notes (../shared/peers/bench_client.py, beside skyrl-cpu.md); only these three lines added.
"""Side-by-side client benchmark for Tinker-compatible servers.

Drives a server through the public `tinker` SDK the way a new user would, measures latency and
throughput, probes optional features, and prints ONE JSON line at the end (stdout).  Progress
goes to stderr.  Runs unchanged against any server that speaks the Tinker HTTP API.

  python bench_client.py --base-url http://127.0.0.1:18000 --model /path/to/model \
      [--pids 123,456] [--launch-t0 <epoch seconds when the server was started>]

Workload (defaults): LoRA rank 8; a fixed batch of 8 sequences x 64 input tokens (ids drawn with
numpy seed 0 from [3, --vocab-limit)); 20 steps of forward_backward(cross_entropy) + optim_step,
both submitted before waiting on either; median step time over steps after --warmup; then
save_weights_and_get_sampling_client and two rounds (cold, warm) of 8 prompts x 4 samples x 32
new tokens (cold round, then --warm-rounds more; median and best warm round reported), all prompts
in flight at once; then get_info / healthz round trips; then optional
feature probes (each isolated, failures recorded, never fatal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
import urllib.request

import numpy as np


def log(*a):
    print("[bench]", *a, file=sys.stderr, flush=True)


def rss_mib(pids):
    """Sum of VmRSS (MiB) of the given pids and all their descendants (Linux /proc)."""
    if not pids:
        return None
    seen, stack, total = set(), list(pids), 0
    while stack:
        p = stack.pop()
        if p in seen:
            continue
        seen.add(p)
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1])
            with open(f"/proc/{p}/task/{p}/children") as f:
                stack.extend(int(c) for c in f.read().split())
        except (FileNotFoundError, ProcessLookupError, PermissionError):
            pass
    return round(total / 1024, 1)


def short_err(e: BaseException) -> str:
    s = f"{type(e).__name__}: {e}"
    s = " ".join(s.split())
    return s[:300]


class _NoSampler:
    def __getattr__(self, name):
        raise RuntimeError("no sampling client (sampling phase failed)")


def sampling_phase(args, tc, types, out, T):
    t2 = time.time()
    sc = tc.save_weights_and_get_sampling_client()
    out["save_weights_and_get_sampling_client_s"] = round(time.time() - t2, 3)

    prng = np.random.RandomState(1)
    prompts = [
        types.ModelInput.from_ints(prng.randint(3, args.vocab_limit, size=args.prompt_len).tolist())
        for _ in range(args.prompts)
    ]
    sp = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0)

    def sample_round():
        ts = time.time()
        futs = [sc.sample(prompt=p, num_samples=args.num_samples, sampling_params=sp) for p in prompts]
        res = [f.result(timeout=T) for f in futs]
        dt = time.time() - ts
        ntok = sum(len(s.tokens) for r in res for s in r.sequences)
        nseq = sum(len(r.sequences) for r in res)
        return {"wall_s": round(dt, 3), "sequences": nseq, "new_tokens": ntok, "tokens_per_s": round(ntok / dt, 1)}

    out["sample_cold"] = sample_round()
    log("sample cold", out["sample_cold"])
    warm = []
    for _ in range(args.warm_rounds):
        warm.append(sample_round())
        log("sample warm", warm[-1])
    if warm:
        ws = sorted(warm, key=lambda r: r["wall_s"])
        out["sample_warm_rounds"] = warm
        out["sample_warm"] = ws[len(ws) // 2]  # median round by wall time
        out["sample_warm_best"] = ws[0]
    # single request latency: 1 prompt x 1 sample x max_tokens
    ts = time.time()
    r = sc.sample(prompt=prompts[0], num_samples=1, sampling_params=sp).result(timeout=T)
    out["sample_single_s"] = round(time.time() - ts, 3)
    out["sample_single_tokens"] = len(r.sequences[0].tokens)
    return sc


def main(out: dict):
    ap = argparse.ArgumentParser()
    ap.add_argument("--base-url", required=True)
    ap.add_argument("--model", required=True, help="base model name/path as the server knows it")
    ap.add_argument("--api-key", default=os.environ.get("TINKER_API_KEY", "tml-dummy-local-key"))
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--vocab-limit", type=int, default=2000, help="token ids are drawn from [3, vocab-limit)")
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--prompt-len", type=int, default=16)
    ap.add_argument("--num-samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--warm-rounds", type=int, default=3, help="sampling rounds after the cold one")
    ap.add_argument("--rtt-reps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=900.0, help="per-future timeout, seconds")
    ap.add_argument("--pids", default="", help="comma-separated server pids (children included) for RSS")
    ap.add_argument("--launch-t0", type=float, default=None, help="epoch seconds when the server was launched")
    ap.add_argument("--skip-probes", action="store_true")
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    pids = [int(p) for p in args.pids.split(",") if p.strip()]
    out.update({"label": args.label, "base_url": args.base_url, "model": args.model})
    rss: dict = {}
    rss["before_client"] = rss_mib(pids)
    T = args.timeout

    t_import = time.time()
    import tinker
    from tinker import types

    out["sdk_version"] = getattr(tinker, "__version__", None)
    out["sdk_import_s"] = round(time.time() - t_import, 3)

    # ---------------- fixed data ----------------
    rng = np.random.RandomState(0)
    seqs = rng.randint(3, args.vocab_limit, size=(args.batch, args.seq_len + 1)).astype(np.int64)

    def ce_datum(row):
        return types.Datum(
            model_input=types.ModelInput.from_ints(row[:-1].tolist()),
            loss_fn_inputs={
                "target_tokens": row[1:].astype(np.int64),
                "weights": np.ones(args.seq_len, dtype=np.float32),
            },
        )

    batch = [ce_datum(r) for r in seqs]
    n_tok = args.batch * args.seq_len

    def mean_nll(fb_out):
        tot, w = 0.0, 0.0
        for o, d in zip(fb_out.loss_fn_outputs, batch):
            lp = np.asarray(o["logprobs"].tolist(), dtype=np.float64).reshape(-1)
            ww = np.asarray(d.loss_fn_inputs["weights"].tolist(), dtype=np.float64).reshape(-1)
            tot += float(-(lp * ww).sum())
            w += float(ww.sum())
        return tot / max(w, 1.0)

    # ---------------- connect + create model ----------------
    t0 = time.time()
    svc = tinker.ServiceClient(base_url=args.base_url, api_key=args.api_key)
    try:
        caps = svc.get_server_capabilities()
        out["server_capabilities"] = [getattr(m, "model_name", str(m)) for m in (caps.supported_models or [])][:8]
    except Exception as e:  # noqa: BLE001
        out["server_capabilities"] = "error: " + short_err(e)
    out["connect_s"] = round(time.time() - t0, 3)

    t1 = time.time()
    tc = svc.create_lora_training_client(base_model=args.model, rank=args.rank, seed=0)
    out["create_model_s"] = round(time.time() - t1, 3)
    if args.launch_t0:
        out["create_model_done_since_launch_s"] = round(time.time() - args.launch_t0, 2)
    rss["after_create_model"] = rss_mib(pids)
    log("created training client in", out["create_model_s"], "s")

    # ---------------- training loop ----------------
    step_s, losses, fb_only_s = [], [], []
    adam = types.AdamParams(learning_rate=args.lr)
    for i in range(args.steps):
        ts = time.time()
        fb = tc.forward_backward(batch, "cross_entropy")
        op = tc.optim_step(adam)
        fbr = fb.result(timeout=T)
        tfb = time.time()
        op.result(timeout=T)
        te = time.time()
        step_s.append(te - ts)
        fb_only_s.append(tfb - ts)
        losses.append(mean_nll(fbr))
        log(f"step {i:2d} {te - ts:7.3f}s loss {losses[-1]:.4f}")
    post = step_s[args.warmup:] or step_s
    out["train"] = {
        "batch": args.batch,
        "seq_len": args.seq_len,
        "rank": args.rank,
        "lr": args.lr,
        "steps": args.steps,
        "first_step_s": round(step_s[0], 3),
        # newer SDKs return from create_lora_training_client before the model exists, so the
        # comparable cold-start figure is create + first step
        "create_plus_first_step_s": round(out["create_model_s"] + step_s[0], 3),
        "median_step_s": round(statistics.median(post), 4),
        "min_step_s": round(min(post), 4),
        "max_step_s_after_warmup": round(max(post), 4),
        "train_tokens_per_s": round(n_tok / statistics.median(post), 1),
        "loss_first": round(losses[0], 4),
        "loss_last": round(losses[-1], 4),
        "loss_falls": bool(losses[-1] < losses[0] - 0.05),
        "losses": [round(x, 4) for x in losses],
        "step_s": [round(x, 3) for x in step_s],
        "metrics_keys": sorted(fbr.metrics.keys()) if getattr(fbr, "metrics", None) else [],
    }
    rss["after_train"] = rss_mib(pids)

    # ---------------- sampling ----------------
    errors = {}
    out["errors"] = errors
    sc = None
    try:
        sc = sampling_phase(args, tc, types, out, T)
    except Exception as e:  # noqa: BLE001
        errors["sampling"] = short_err(e)
        log("sampling phase failed:", short_err(e))
    rss["after_sample"] = rss_mib(pids)

    # ---------------- round trips ----------------
    try:
        rt = []
        for _ in range(args.rtt_reps):
            ts = time.time()
            tc.get_info()
            rt.append(time.time() - ts)
        out["get_info_rtt_ms_median"] = round(1000 * statistics.median(rt), 2)
    except Exception as e:  # noqa: BLE001
        errors["get_info"] = short_err(e)
    hz = []
    for _ in range(args.rtt_reps):
        ts = time.time()
        try:
            with urllib.request.urlopen(args.base_url.rstrip("/") + "/api/v1/healthz", timeout=10) as resp:
                resp.read()
            hz.append(time.time() - ts)
        except Exception:  # noqa: BLE001
            break
    out["healthz_rtt_ms_median"] = round(1000 * statistics.median(hz), 2) if hz else None

    prng = np.random.RandomState(1)
    prompts = [
        types.ModelInput.from_ints(prng.randint(3, args.vocab_limit, size=args.prompt_len).tolist())
        for _ in range(args.prompts)
    ]
    sp = types.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, seed=0)
    if sc is None:
        sc = _NoSampler()

    # ---------------- feature probes ----------------
    probes: dict = {}

    def probe(name, fn):
        ts = time.time()
        try:
            detail = fn()
            probes[name] = {"ok": True, "s": round(time.time() - ts, 3)}
            if detail is not None:
                probes[name]["detail"] = detail
        except Exception as e:  # noqa: BLE001
            probes[name] = {"ok": False, "s": round(time.time() - ts, 3), "error": short_err(e)}
            log(f"probe {name} failed:", short_err(e))
            if os.environ.get("BENCH_DEBUG"):
                traceback.print_exc()
        log("probe", name, probes[name].get("ok"))

    if not args.skip_probes:
        probe("forward_only_cross_entropy", lambda: round(mean_nll(tc.forward(batch, "cross_entropy").result(timeout=T)), 4))

        def rl_batch():
            out_b = []
            for row in seqs:
                out_b.append(
                    types.Datum(
                        model_input=types.ModelInput.from_ints(row[:-1].tolist()),
                        loss_fn_inputs={
                            "target_tokens": row[1:].astype(np.int64),
                            "logprobs": np.full(args.seq_len, -7.0, dtype=np.float32),
                            "advantages": np.linspace(-1, 1, args.seq_len).astype(np.float32),
                        },
                    )
                )
            return out_b

        for lf in ("importance_sampling", "ppo", "cispo", "dro"):
            probe(f"loss_{lf}", lambda lf=lf: sorted(tc.forward_backward(rl_batch(), lf).result(timeout=T).metrics.keys()))

        def custom():
            import torch  # noqa: F401

            def loss_fn(data, logprobs_list):
                loss = sum((-lp).mean() for lp in logprobs_list) / len(logprobs_list)
                return loss, {"custom_loss": float(loss.detach())}

            r = tc.forward_backward_custom(batch, loss_fn).result(timeout=T)
            return r.metrics

        probe("forward_backward_custom", custom)

        def cl():
            lps = sc.compute_logprobs(prompts[0]).result(timeout=T)
            return {"n": len(lps), "first_two": [None if x is None else round(x, 3) for x in lps[:2]]}

        probe("compute_logprobs", cl)

        def plp():
            r = sc.sample(prompt=prompts[0], num_samples=1, sampling_params=sp, include_prompt_logprobs=True).result(timeout=T)
            pl = r.prompt_logprobs
            return {"n": None if pl is None else len(pl)}

        probe("sample_prompt_logprobs", plp)

        def topk():
            r = sc.sample(
                prompt=prompts[0], num_samples=1, sampling_params=sp, include_prompt_logprobs=True, topk_prompt_logprobs=5
            ).result(timeout=T)
            tk = r.topk_prompt_logprobs
            return {"n": None if tk is None else len(tk)}

        probe("sample_topk_prompt_logprobs", topk)

        def stop_tokens():
            sp2 = types.SamplingParams(max_tokens=args.max_tokens, temperature=0.0, stop=[prompts[1].to_ints()[0]])
            r = sc.sample(prompt=prompts[0], num_samples=1, sampling_params=sp2).result(timeout=T)
            return {"tokens": len(r.sequences[0].tokens), "stop_reason": str(r.sequences[0].stop_reason)}

        probe("sample_greedy_with_stop_token", stop_tokens)

        state = {}

        def save_state():
            r = tc.save_state("bench-state").result(timeout=T)
            state["path"] = r.path
            return r.path

        probe("save_state", save_state)
        probe("load_state", lambda: str(tc.load_state(state["path"]).result(timeout=T))[:120])
        probe("load_state_with_optimizer", lambda: str(tc.load_state_with_optimizer(state["path"]).result(timeout=T))[:120])

        def from_state():
            tc2 = svc.create_training_client_from_state(state["path"])
            return mean_nll(tc2.forward(batch, "cross_entropy").result(timeout=T))

        probe("create_training_client_from_state", from_state)

        def named_sampler():
            r = tc.save_weights_for_sampler("bench-sampler").result(timeout=T)
            sc2 = svc.create_sampling_client(model_path=r.path)
            rr = sc2.sample(prompt=prompts[0], num_samples=1, sampling_params=sp).result(timeout=T)
            return {"path": r.path, "tokens": len(rr.sequences[0].tokens)}

        probe("save_weights_for_sampler+create_sampling_client", named_sampler)

        def base_sampler():
            sc3 = svc.create_sampling_client(base_model=args.model)
            rr = sc3.sample(prompt=prompts[0], num_samples=1, sampling_params=sp).result(timeout=T)
            return {"tokens": len(rr.sequences[0].tokens)}

        probe("base_model_sampling_client", base_sampler)

        def tokenizer():
            tok = tc.get_tokenizer()
            return {"cls": type(tok).__name__, "hello_ids": tok.encode("hello world")[:8]}

        probe("get_tokenizer", tokenizer)

        def rest():
            rc = svc.create_rest_client()
            runs = rc.list_training_runs().result(timeout=60)
            return {"n_runs": len(getattr(runs, "training_runs", []) or [])}

        probe("rest_list_training_runs", rest)

        def ckpts():
            rc = svc.create_rest_client()
            r = rc.list_checkpoints(tc.model_id).result(timeout=60)
            return {"n": len(getattr(r, "checkpoints", []) or [])}

        probe("rest_list_checkpoints", ckpts)

    out["probes"] = probes
    rss["end"] = rss_mib(pids)
    out["server_rss_mib"] = rss
    out["client_total_s"] = round(time.time() - t0, 2)


if __name__ == "__main__":
    result: dict = {}
    rc = 0
    try:
        main(result)
    except SystemExit:
        raise
    except BaseException as e:  # noqa: BLE001
        result["fatal"] = short_err(e)
        traceback.print_exc()
        rc = 1
    print(json.dumps(result), flush=True)
    os._exit(rc)  # do not hang on SDK background threads
