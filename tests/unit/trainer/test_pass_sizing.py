"""PassSizing: a base's effective sequence-parallel layout and activation estimate, read from its config.json, and
what it tells a user whose forward(_backward) is too large: shorter datums or passes, and more ranks for one long
datum where the base splits it (or why it does not)."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.config import WorkerGroupConfig
from app.models.model_config import read_model_config
from app.trainer.memory_estimate import estimate_activation_bytes
from app.trainer.pass_sizing import ActivationBytes, PassSizing
from app.training.datum_layout import DatumLayout
from tests.conftest import TINY_MODEL

TINY_CONFIG = read_model_config(str(TINY_MODEL))  # qwen2: 4 attention heads, 2 key/value heads


def sizing(
    world_size: int, estimate: ActivationBytes | None = None, sequence_parallel: int = 1, **shape: Any
) -> PassSizing:
    """A group of `world_size` ranks (`shape`: WorkerGroupConfig's fields) on a base that splits a long datum across
    `sequence_parallel` of them, whose activations `estimate` sizes."""
    group = WorkerGroupConfig(num_workers=world_size, sequence_parallel=sequence_parallel, **shape)
    layout = DatumLayout(world_size, sequence_parallel, group.sequence_parallel_min_tokens)
    return PassSizing(group, layout, estimate)


def test_the_base_says_how_many_ranks_split_a_datum_and_how_its_activations_grow() -> None:
    assert TINY_CONFIG is not None
    two = PassSizing.of(WorkerGroupConfig(num_workers=2), 2, TINY_CONFIG, dtype_bytes=2)
    assert (two.layout, two.unsplit) == (DatumLayout(2, 2, 4096), "")  # sequence_parallel unset: every rank
    assert two.activation_bytes is not None
    assert two.activation_bytes(1000, backward=False) == estimate_activation_bytes(
        TINY_CONFIG, 1000, 2, True, backward=False
    )
    four = PassSizing.of(WorkerGroupConfig(num_workers=4), 4, TINY_CONFIG)
    assert (four.layout.sequence_parallel, four.unsplit) == (
        1,
        "the model's 2 key/value heads do not divide by 4 ranks",
    )
    unknown = PassSizing.of(WorkerGroupConfig(num_workers=2), 2, None)  # no config.json: whole datums, no estimate
    assert (unknown.layout, unknown.activation_bytes) == (DatumLayout(2, 1, 4096), None)
    unsized = PassSizing.of(WorkerGroupConfig(num_workers=2), 2, {"model_type": "qwen2", "num_attention_heads": 4})
    assert unsized.activation_bytes is None and unsized.layout.sequence_parallel == 2


def test_a_long_datum_is_told_what_splits_it_across_more_ranks() -> None:
    def advice(sized: PassSizing, *lengths: int) -> list[str]:
        batch = np.array(lengths)
        return sized.remedies(batch, sized.largest_pass_tokens(batch), True, weights=False)

    assert TINY_CONFIG is not None
    assert advice(sizing(2), 9000, 100) == [
        "send shorter datums",
        "set trainer.sequence_parallel (now 1) to a divisor of trainer.num_workers (2), or leave it unset for all of "
        "them: a datum of more than 4096 tokens is then split across that many ranks",
    ]
    assert advice(sizing(1), 9000)[1].startswith(
        "raise trainer.num_workers (now 1) with trainer.sequence_parallel unset"
    )
    every_rank = PassSizing.of(WorkerGroupConfig(num_workers=2), 2, TINY_CONFIG)
    assert advice(every_rank, 9000)[1] == (
        "raise trainer.num_workers (now 2): a datum of more than 4096 tokens is split across all of them, "
        "ceil(9000 / num_workers) tokens a rank (now 4500)"
    )
    assert advice(sizing(4, sequence_parallel=2), 9000)[1] == (
        "raise trainer.sequence_parallel (now 2; a larger divisor of num_workers): a rank runs ceil(9000 / "
        "sequence_parallel) tokens of a split datum (now 4500)"
    )
    assert advice(sizing(2, sequence_parallel=2), 9000)[1].startswith(
        "raise trainer.sequence_parallel (now 2; trainer.num_workers (now 2) with it)"
    )
    assert advice(sizing(2, sequence_parallel=2), 4000)[1].startswith(
        "lower trainer.sequence_parallel_min_tokens (now 4096) below 4000"
    )
    assert advice(sizing(2), 4000) == ["send shorter datums"]  # not long: sequence parallelism is beside the point
    unsplit = PassSizing.of(WorkerGroupConfig(num_workers=4), 4, TINY_CONFIG)
    assert advice(unsplit, 9000) == [
        "send shorter datums (no datum is split across ranks on this base: the model's 2 key/value heads do not "
        "divide by 4 ranks)"
    ]
    assert advice(sizing(2, micro_batch_tokens=1200), 600, 600, 600) == [
        "lower trainer.micro_batch_tokens (now 1200; a pass then holds fewer datums)"  # rank 0: 2 x 600
    ]
