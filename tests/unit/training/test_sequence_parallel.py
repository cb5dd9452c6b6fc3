"""Sequence parallelism (app.training.sequence_parallel) on two real gloo ranks: a long datum split across them gives
the loss, per-token outputs and adapter gradients the same datum gives run whole on one rank, for a dense family, a
mixture of experts and a Gated DeltaNet hybrid; with every loss kind (built-in, custom, stable_reinforce), a critic,
short datums beside it, a sharded base and activation checkpointing. Both engines of a comparison run in the same
two processes (one spawn per test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from app.messages import ShardOutput
from app.models.embedded import build_embedded_model
from app.training.base_model import load_base_model, recompute_activations, shard_base
from app.training.datum_layout import DatumLayout, sequence_parallel_size
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from app.training_data.sharding import merge_shards
from tests.conftest import TINY_MODEL
from tests.tolerances import assert_sums_close, network_terms
from tests.unit.training import custom_loss_graphs
from tests.unit.training.sharded_ranks import ADAM, CRITIC, POLICY, batch_of, run_ranks

MIN_TOKENS = 64  # datums longer than this are split
# float32 on CPU: the split changes the order of additions only (attention over the same keys, per-token layers on
# the same rows): tests/tolerances.py's bound for a gradient's chain of sums (every tiny base has the tiny Qwen2's
# widths). Measured: losses equal to 1e-7 relative, gradients within 1e-6 of their largest entry
TERMS = 2 * network_terms(TINY_MODEL)


def _inputs(rng: np.random.Generator, total: int) -> np.ndarray:
    return rng.normal(size=total).astype(np.float32)


def _old(rng: np.random.Generator, total: int) -> np.ndarray:
    return -rng.uniform(5.0, 9.0, total).astype(np.float32)


LENGTHS = [301, 20, 9]  # one split datum (an odd length: the last slice is padded) and short ones
# on 4 ranks in 2 groups of 2: the first group runs 301 and 150, the second 257 and an idle pass (a sharded base)
FOUR_RANK_LENGTHS = [301, 20, 9, 257, 150, 33]


def _requests(full: bool, lengths: list[int] = LENGTHS) -> list[tuple[str, str, dict[str, float], PackedBatch, Any]]:
    """(model, loss, config, batch, custom program) of every request a comparison runs."""
    requests: list[tuple[str, str, dict[str, float], PackedBatch, Any]] = [
        ("p", "cross_entropy", {}, batch_of(lengths, seed=1), None)
    ]
    if full:
        rl = batch_of(
            lengths,
            seed=2,
            advantages=_inputs,
            logprobs=_old,
            sampler_logprobs=_old,
            sampled_mask=lambda rng, total: (rng.uniform(size=total) < 0.8).astype(np.float32),
        )
        custom = batch_of(lengths, seed=3, advantages=_inputs, old_logprobs=_old)
        graph = {"logprobs": 1, "advantages": 1, "old_logprobs": 1}
        program = custom_loss_graphs.program(custom_loss_graphs.clipped_pg, graph)
        stable = {"kl_coeff": 0.1, "ratio_cap": 2.0, "mask_low": 0.5, "mask_high": 2.0}
        values = batch_of(lengths, seed=4, values=_inputs, returns=_inputs)
        requests += [
            ("p", "ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, rl, None),
            ("p", "stable_reinforce", stable, rl, None),
            ("p", "custom", {}, custom, program),
            ("c", "ppo_critic", {"value_clip": 0.2}, values, None),
        ]
    return requests


def _engine(path: str, rank: int, world: int, sequence_parallel: int, sharded: bool) -> TrainingEngine:
    base = load_base_model(path)
    recompute_activations(base)
    if sharded:
        shard_base(base, "cpu")
    engine = TrainingEngine(
        base,
        rank=rank,
        world_size=world,
        sharded=sharded,
        sequence_parallel=sequence_parallel,
        sequence_parallel_min_tokens=MIN_TOKENS,
    )
    engine.create_model("p", POLICY)
    engine.create_model("c", CRITIC)
    return engine


def _run(engine: TrainingEngine, full: bool, lengths: list[int]) -> list[dict[str, Any]]:
    """Each request's shard answer and the gradients it left (summed over the ranks), then a step."""
    results = []
    for model_id, loss, config, batch, program in _requests(full, lengths):
        out = engine.forward_backward(model_id, loss, config, batch, False, program)
        params = engine.loaded(model_id).params
        grads = [p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        for g in grads:
            dist.all_reduce(g)
        engine.optim_step(model_id, ADAM)
        results.append({"out": out, "grads": [g.numpy() for g in grads]})
    return results


def compare(
    rank: int,
    world: int,
    *,
    paths: list[str],
    full: bool,
    sharded: bool,
    sequence_parallel: int | None = None,
    lengths: list[int] = LENGTHS,
) -> list[dict[str, Any]]:
    """For each base: the requests run with every datum whole, then with the long ones split across groups of
    `sequence_parallel` ranks (None: all of them)."""
    results = []
    for path in paths:
        whole = _run(_engine(path, rank, world, 1, sharded), full, lengths)
        split = _run(_engine(path, rank, world, sequence_parallel or world, sharded), full, lengths)
        results.append({"whole": whole, "split": split})
    return results


def _merged(per_rank: list[dict[str, Any]], which: str, i: int, batch: PackedBatch) -> tuple[Any, list[ShardOutput]]:
    shards = [r[which][i]["out"] for r in per_rank]
    return merge_shards(batch.offsets, shards), shards


def _assert_same(per_rank: list[dict[str, Any]], full: bool, base: str = "tiny", lengths: list[int] = LENGTHS) -> None:
    for i, (_, name, _, batch, _) in enumerate(_requests(full, lengths)):
        loss = f"{base}: {name}"
        whole, _ = _merged(per_rank, "whole", i, batch)
        split, split_shards = _merged(per_rank, "split", i, batch)
        answered = np.concatenate([s.datum_indices for s in split_shards])
        assert sorted(answered.tolist()) == list(range(len(lengths))), loss
        assert_sums_close(split.metrics["loss:sum"], whole.metrics["loss:sum"], TERMS, np.float32, err_msg=loss)
        for name in whole.outputs:
            assert_sums_close(split.outputs[name], whole.outputs[name], TERMS, err_msg=loss)
        for a, b in zip(per_rank[0]["whole"][i]["grads"], per_rank[0]["split"][i]["grads"], strict=True):
            assert_sums_close(b, a, TERMS, err_msg=loss)
    assert all(0 not in s["out"].datum_indices for s in per_rank[1]["split"])  # its group's first rank answers


def test_a_split_datum_trains_as_a_whole_one_with_every_loss_on_a_sharded_base() -> None:
    (per_rank,) = zip(*run_ranks(compare, paths=[str(TINY_MODEL)], full=True, sharded=True), strict=True)
    _assert_same(list(per_rank), full=True)


def test_a_split_datum_trains_as_a_whole_one_on_a_moe_and_a_gated_deltanet_hybrid(presets_dir: Path) -> None:
    presets = ["tiny-qwen3-moe", "tiny-qwen3_5"]
    paths = [str(build_embedded_model(preset, presets_dir / preset)) for preset in presets]
    for preset, per_rank in zip(presets, zip(*run_ranks(compare, paths=paths, full=False, sharded=False)), strict=True):
        _assert_same(list(per_rank), full=False, base=preset)


def test_long_datums_dealt_to_two_groups_of_two_ranks_train_as_whole_ones() -> None:
    """The 2-D layout (data x sequence) on a base sharded across all four ranks: the group with fewer split datums
    runs an idle pass to join the weight gathers."""
    runs = run_ranks(
        compare,
        world=4,
        paths=[str(TINY_MODEL)],
        full=False,
        sharded=True,
        sequence_parallel=2,
        lengths=FOUR_RANK_LENGTHS,
    )
    (per_rank,) = zip(*runs, strict=True)
    _assert_same(list(per_rank), full=False, lengths=FOUR_RANK_LENGTHS)


def test_the_layout_splits_only_long_datums_and_every_datum_has_one_answering_rank() -> None:
    layout = DatumLayout(world_size=4, sequence_parallel=2, min_tokens=100)
    lengths = np.array([50, 300, 20, 500, 10, 700])
    answered = []
    for rank in range(4):
        answered += layout.whole_datums(lengths, rank).tolist()
        if layout.reports(rank):
            answered += layout.split_datums(lengths, rank).tolist()
    assert sorted(answered) == list(range(6))
    assert layout.split_datums(lengths, 0).tolist() == layout.split_datums(lengths, 1).tolist() == [1, 5]
    assert layout.passes(lengths, 3, micro_batch_tokens=64) == [250]  # no whole datum left for rank 3; half of 500
    assert DatumLayout(world_size=2, sequence_parallel=1, min_tokens=100).split(lengths).sum() == 0
    # every slice keeps at least 4 positions (the previous rank's last 3 feed a Gated DeltaNet's convolution)
    assert DatumLayout(world_size=4, sequence_parallel=4, min_tokens=1).split(np.array([12, 13])).tolist() == [
        False,
        True,
    ]


def test_a_family_or_head_count_that_cannot_split_keeps_datums_whole() -> None:
    tiny = {"model_type": "qwen2", "num_attention_heads": 4, "num_key_value_heads": 2}
    assert sequence_parallel_size(tiny, None, 2) == (2, "")
    assert sequence_parallel_size(tiny, 1, 2) == (1, "")
    assert sequence_parallel_size(tiny, None, 4)[1] == "the model's 2 key/value heads do not divide by 4 ranks"
    assert "gpt_oss" in sequence_parallel_size({**tiny, "model_type": "gpt_oss"}, None, 2)[1]
    sliding = {**tiny, "layer_types": ["sliding_attention", "full_attention"]}
    assert "sliding-window" in sequence_parallel_size(sliding, None, 2)[1]
