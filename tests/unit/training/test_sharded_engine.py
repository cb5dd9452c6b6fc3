"""The engine with its base sharded across two real gloo ranks (FSDP2) against the same engine with the base
replicated: policies, critics, built-in and custom losses, micro-batches that leave one rank idle, checkpoints;
and the memory a sharded base leaves each rank, measured from the processes."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from app.training.base_model import load_base_model, shard_base
from app.training.engine import TrainingEngine
from app.training.micro_batches import micro_batches
from tests.conftest import TINY_MODEL
from tests.tolerances import assert_sums_close, network_terms
from tests.unit.training import custom_loss_graphs
from tests.unit.training.sharded_ranks import ADAM, CRITIC, POLICY, batch_of, engine_on, run_ranks

# 7 datums over 2 ranks: rank 0 gets lengths 9, 5, 30, 3 and rank 1 gets 23, 17, 6. At 40 tokens a pass, rank 0
# runs 3 passes ([9, 5], [30], [3]) and rank 1 two ([23], [17, 6]) plus an idle one.
LENGTHS = [9, 23, 5, 17, 30, 6, 3]
PASS_TOKENS = 40
# float32 on CPU: sharding changes no arithmetic (0.0 measured), but the gathered weights lie elsewhere in memory, and
# MKL's kernels may sum in another order for other alignments: tests/tolerances.py's bound, a gradient's chain of sums
TERMS = 2 * network_terms(TINY_MODEL)


def _rl_inputs(rng: np.random.Generator, total: int) -> np.ndarray:
    return rng.normal(size=total).astype(np.float32)


def _old_logprobs(rng: np.random.Generator, total: int) -> np.ndarray:
    return -rng.uniform(5.0, 9.0, total).astype(np.float32)


def train_everything(
    rank: int, world: int, *, sharding: str, pass_tokens: int, out: str, shard_group_size: int | None = None
) -> dict[str, Any]:
    """Train a policy (cross_entropy, ppo, stable_reinforce, a custom loss) and a critic a few steps each, save the
    policy's state (rank 0) and load it into a new model; everything a test compares."""
    engine = engine_on(
        TINY_MODEL, rank, world, sharding=sharding, micro_batch_tokens=pass_tokens, shard_group_size=shard_group_size
    )
    engine.create_model("p", POLICY)
    engine.create_model("c", CRITIC)
    sft = batch_of(LENGTHS, seed=1)
    rl = batch_of(
        LENGTHS,
        seed=2,
        advantages=_rl_inputs,
        logprobs=_old_logprobs,
        sampler_logprobs=_old_logprobs,  # stable_reinforce's, filled in by the ingress from its stability records
        sampled_mask=lambda rng, total: (rng.uniform(size=total) < 0.8).astype(np.float32),
    )
    custom = batch_of(LENGTHS, seed=3, advantages=_rl_inputs, old_logprobs=_old_logprobs)
    program = custom_loss_graphs.program(
        custom_loss_graphs.clipped_pg, {"logprobs": 1, "advantages": 1, "old_logprobs": 1}
    )
    values = batch_of(LENGTHS, seed=4, values=_rl_inputs, returns=_rl_inputs)
    losses, metrics = [], []
    for loss_fn, config, batch in [
        ("cross_entropy", {}, sft),
        ("cross_entropy", {}, sft),
        ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, rl),
        ("stable_reinforce", {"kl_coeff": 0.1, "ratio_cap": 2.0, "mask_low": 0.5, "mask_high": 2.0}, rl),
    ]:
        out_ = engine.forward_backward("p", loss_fn, config, batch, False)
        losses.append(out_.loss_sum)
        metrics.append(out_.stats)
        engine.optim_step("p", ADAM)
    out_ = engine.forward_backward("p", "custom", {}, custom, False, program)
    losses.append(out_.loss_sum)
    metrics.append(out_.stats)
    engine.optim_step("p", ADAM)
    for _ in range(2):
        losses.append(engine.forward_backward("c", "ppo_critic", {"value_clip": 0.2}, values, False).loss_sum)
        engine.optim_step("c", ADAM)
    # A pass with no backward, then a save on rank 0 alone (a `forward`, then `save_state`): the ranks' next gathers
    # must still match (the save's state_dict() resharded what rank 0 alone had kept gathered: gloo failed the pass)
    engine.forward_backward("p", "cross_entropy", {}, sft, True)
    if rank == 0:
        engine.save_state("p", Path(out) / "policy")
    torch.distributed.barrier()
    logprobs = engine.forward_backward("p", "cross_entropy", {}, sft, True)
    engine.create_model("q", POLICY)
    engine.load_state("q", Path(out) / "policy", with_optimizer=True)
    return {
        "losses": losses,
        "metrics": metrics,
        "logprobs": logprobs,
        "reloaded_logprobs": engine.forward_backward("q", "cross_entropy", {}, sft, True),
        "values": engine.forward_backward("c", "ppo_critic", {"value_clip": 0.2}, values, True),
        "policy": {k: v.numpy() for k, v in engine.adapter_state("p").items()},
        "critic": {k: v.numpy() for k, v in engine.adapter_state("c").items()},
    }


def _max_difference(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> float:
    assert a.keys() == b.keys()
    return max(float(np.abs(a[k] - b[k]).max()) for k in a)


def _assert_all_sums_close(ours: dict[str, Any], theirs: dict[str, Any]) -> None:
    assert ours.keys() == theirs.keys()
    for k in ours:
        assert_sums_close(ours[k], theirs[k], TERMS, np.float32, err_msg=k)  # stats: float32 sums held as floats


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for name, world, sharding, pass_tokens, group in [
        ("fsdp", 2, "fsdp", PASS_TOKENS, None),
        ("replicate", 2, "replicate", PASS_TOKENS, None),
        ("one_pass", 2, "replicate", 16384, None),
        ("hybrid", 4, "fsdp", PASS_TOKENS, 2),  # sharded within pairs of ranks, replicated across the pairs
    ]:
        directory = str(tmp_path_factory.mktemp(name))
        out[name] = run_ranks(
            train_everything, world, sharding=sharding, pass_tokens=pass_tokens, out=directory, shard_group_size=group
        )
    return out


def test_the_pass_plan_leaves_one_rank_idle() -> None:
    """The premise of the comparison: the ranks run different numbers of micro-batches."""
    lengths = np.array(LENGTHS)
    assert [len(micro_batches(lengths[r::2], PASS_TOKENS)) for r in (0, 1)] == [3, 2]


def test_fsdp_trains_exactly_as_replicated(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Losses, metrics, logprobs, values and every adapter and value-head weight after 5 policy and 2 critic steps
    on a sharded base equal those on a replicated one (and are the same on both ranks)."""
    fsdp, replicated = runs["fsdp"], runs["replicate"]
    for rank in (0, 1):
        assert_sums_close(fsdp[rank]["losses"], replicated[rank]["losses"], TERMS, np.float32)
        for ours, theirs in zip(fsdp[rank]["metrics"], replicated[rank]["metrics"], strict=True):
            _assert_all_sums_close(ours, theirs)
        for output in ("logprobs", "reloaded_logprobs", "values"):
            _assert_all_sums_close(fsdp[rank][output].outputs, replicated[rank][output].outputs)
        _assert_all_sums_close(fsdp[rank]["policy"], replicated[rank]["policy"])
        _assert_all_sums_close(fsdp[rank]["critic"], replicated[rank]["critic"])
    # exact: both ranks step with the same all-reduced gradients, the same bytes in the same arithmetic
    assert _max_difference(fsdp[0]["policy"], fsdp[1]["policy"]) == 0.0  # the adapters stay replicated
    assert any(m for m in fsdp[0]["metrics"]), "stable_reinforce and the custom loss report metrics"


def test_a_state_saved_under_fsdp_reloads_the_same_model(runs: dict[str, list[dict[str, Any]]]) -> None:
    for rank in (0, 1):
        run = runs["fsdp"][rank]
        # exact: the reloaded adapter is the saved one's bytes, run through the same passes
        assert _max_difference(run["reloaded_logprobs"].outputs, run["logprobs"].outputs) == 0.0


def test_micro_batches_change_only_rounding(runs: dict[str, list[dict[str, Any]]]) -> None:
    """The same training in one pass per rank: equal up to the order of float additions."""
    split, whole = runs["replicate"][0], runs["one_pass"][0]
    assert_sums_close(split["losses"], whole["losses"], TERMS, np.float32)
    # weights after Adam steps, in absolute terms: Adam divides each gradient entry by its own running magnitude, so a
    # near-cancelling entry's rounding moves its weight whatever its scale (test_mixed_pass's docstring)
    assert _max_difference(split["policy"], whole["policy"]) < 1e-4


def _resident_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def base_resident_bytes(rank: int, world: int, *, path: str, sharding: str) -> int:
    """What loading (and sharding) the base adds to this process's resident memory, every weight touched. The memory
    freed before (the rank's earlier calls) is handed back to the system first: reused, it would hide part of it."""
    gc.collect()
    ctypes.CDLL(None).malloc_trim(0)
    before = _resident_kib()
    base = load_base_model(path)
    if sharding == "fsdp":
        shard_base(base, "cpu")
    engine = TrainingEngine(base, rank=rank, world_size=world, sharded=sharding == "fsdp")
    with torch.no_grad():  # read every local weight: a memory-mapped file counts once its pages are read
        sum(float(getattr(p, "_local_tensor", p).float().sum()) for p in engine.pool.model.parameters())
    gc.collect()
    return (_resident_kib() - before) * 1024


@pytest.fixture(scope="module")
def wide_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 4-layer Qwen2 of 69M float32 parameters (276 MB): weights large enough to see in a process's memory."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    out = tmp_path_factory.mktemp("wide")
    config = Qwen2Config(
        vocab_size=2048,
        hidden_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        intermediate_size=4096,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    Qwen2ForCausalLM(config).save_pretrained(out)
    return out


def test_each_rank_holds_about_half_the_base(wide_model: Path) -> None:
    replicated = run_ranks(base_resident_bytes, path=str(wide_model), sharding="replicate")
    sharded = run_ranks(base_resident_bytes, path=str(wide_model), sharding="fsdp")
    weights = sum(p.stat().st_size for p in wide_model.glob("*.safetensors"))
    assert min(replicated) > 0.9 * weights  # the measurement sees the weights
    assert max(sharded) <= 0.6 * min(replicated), (sharded, replicated)


def test_hybrid_sharding_trains_the_same_model(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Four ranks, the base sharded within pairs: every rank ends with the same adapters, equal to two replicated
    ranks' up to the order of float additions (the datums split four ways, not two)."""
    hybrid, replicated = runs["hybrid"], runs["replicate"]
    assert all(_max_difference(hybrid[0]["policy"], other["policy"]) == 0.0 for other in hybrid[1:])
    total = np.sum([rank["losses"] for rank in hybrid], axis=0)  # each rank reports its own datums' loss
    assert_sums_close(total, np.sum([rank["losses"] for rank in replicated], axis=0), TERMS, np.float32)
    assert _max_difference(hybrid[0]["policy"], replicated[0]["policy"]) < 1e-4
    assert _max_difference(hybrid[0]["critic"], replicated[0]["critic"]) < 1e-4
