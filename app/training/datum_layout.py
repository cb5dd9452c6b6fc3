"""Which rank runs which datum of a forward(_backward), and in how many tokens a pass: shared by the ranks' engine
(app.training.engine), the Trainer's mixing of models into one pass, and what a rank's memory is sized by (the
workers' deaths, the refusal before any pass). Pure numpy: the Trainer imports it without torch.

A datum of at most `min_tokens` tokens goes whole to one rank: the i-th such datum of a request to rank i mod
world_size (data parallel). A longer one is split across a sequence-parallel group of `sequence_parallel`
consecutive ranks (app.training.sequence_parallel), each running ceil(length / sequence_parallel) of its tokens: the
j-th such datum to group j mod (world_size / sequence_parallel). With sequence_parallel 1 every datum goes whole.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from app.models.families import family_of
from app.training.micro_batches import micro_batches

# a slice reaches back this far into the previous rank's: the Gated DeltaNet convolution's 3 positions, and one more
MIN_SLICE_TOKENS = 4


@dataclass(frozen=True)
class DatumLayout:
    world_size: int
    sequence_parallel: int = 1
    min_tokens: int = 4096

    @property
    def groups(self) -> int:
        return self.world_size // self.sequence_parallel

    def split(self, lengths: np.ndarray) -> np.ndarray:
        """Which datums are split across a sequence-parallel group (bool per datum): those over min_tokens whose
        slices have at least MIN_SLICE_TOKENS positions."""
        longer = np.maximum(self.min_tokens, (MIN_SLICE_TOKENS - 1) * self.sequence_parallel)
        return (lengths > longer) & (self.sequence_parallel > 1)

    def whole_datums(self, lengths: np.ndarray, rank: int) -> np.ndarray:
        """The indices of the datums `rank` runs whole, in request order."""
        return np.flatnonzero(~self.split(lengths))[rank :: self.world_size].astype(np.int64)

    def split_datums(self, lengths: np.ndarray, rank: int) -> np.ndarray:
        """The indices of the split datums `rank`'s group runs, in request order."""
        return np.flatnonzero(self.split(lengths))[self.group_of(rank) :: self.groups].astype(np.int64)

    def group_of(self, rank: int) -> int:
        return rank // self.sequence_parallel

    def group_ranks(self, group: int) -> list[int]:
        return list(range(group * self.sequence_parallel, (group + 1) * self.sequence_parallel))

    def reports(self, rank: int) -> bool:
        """Whether `rank` answers for its group's split datums (the group's first rank; every rank of it has them)."""
        return rank % self.sequence_parallel == 0

    def passes(self, lengths: np.ndarray, rank: int, micro_batch_tokens: int) -> list[int]:
        """The padded tokens of each pass `rank` runs: its whole datums in micro-batches, then its share of each of its
        group's split datums."""
        own = lengths[self.whole_datums(lengths, rank)]
        whole = [len(own[run]) * int(own[run].max()) for run in micro_batches(own, micro_batch_tokens)]
        shares = [math.ceil(int(n) / self.sequence_parallel) for n in lengths[self.split_datums(lengths, rank)]]
        return whole + shares

    def largest_pass_tokens(self, lengths: np.ndarray, micro_batch_tokens: int) -> int:
        """The tokens of the largest pass any rank runs (padding included)."""
        return max(max(self.passes(lengths, r, micro_batch_tokens), default=0) for r in range(self.world_size))


def sequence_parallel_size(config_json: dict[str, Any], requested: int | None, world_size: int) -> tuple[int, str]:
    """How many ranks split a long datum on a base of this config.json (a multimodal model's `text_config`: its
    decoder), given trainer.sequence_parallel (`requested`; None: every rank of the group), and why it is 1 when
    more were asked for ("" otherwise). Every head count the exchanges scatter must divide by it."""
    size = world_size if requested is None else requested
    if size <= 1:
        return 1, ""
    text = config_json.get("text_config") or config_json
    model_type = text.get("model_type") or config_json.get("model_type")
    if model_type is None:
        return 1, "the base model's config.json could not be read"
    family = family_of(str(model_type))
    if not family.sequence_parallel:
        return 1, f"a {family.name} base's sequence mixers are not split across ranks"
    if text.get("use_sliding_window") or "sliding_attention" in (text.get("layer_types") or ()):
        return 1, "sliding-window attention layers are not split across ranks"
    heads = {
        "attention heads": text.get("num_attention_heads"),
        "key/value heads": text.get("num_key_value_heads") or text.get("num_attention_heads"),
        "linear-attention value heads": text.get("linear_num_value_heads"),
    }
    for name, count in heads.items():
        if count is not None and int(count) % size:
            return 1, f"the model's {count} {name} do not divide by {size} ranks"
    return size, ""
