"""What a forward(_backward) asks of a rank's memory, from the worker group's shape and the base's config.json: the
tokens of its largest pass on any rank (app.training.datum_layout: a datum of more than sequence_parallel_min_tokens
split across the base's effective sequence-parallel group), about the activations that pass needs
(app.trainer.memory_estimate), and what would shrink it. The refusal before any pass (app.trainer.memory_refusal)
and the error after the workers died (app.trainer.worker_deaths) are sized and worded by it."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np

from app.config import WorkerGroupConfig
from app.trainer.memory_estimate import estimate_activation_bytes
from app.training.datum_layout import DatumLayout, sequence_parallel_size

# About the bytes of activations a pass of this many tokens (padding included) needs on a rank; `backward`: with its
# backward (app.trainer.memory_estimate, for the trainer's base model and dtype)
ActivationBytes = Callable[..., int]


@dataclass(frozen=True)
class PassSizing:
    shape: WorkerGroupConfig
    layout: DatumLayout
    activation_bytes: ActivationBytes | None = None  # None: unknown (no config.json, or not a decoder it models)
    unsplit: str = ""  # why the base splits no datum though trainer.sequence_parallel asks for it

    @classmethod
    def of(
        cls, shape: WorkerGroupConfig, world_size: int, config_json: dict[str, Any] | None, dtype_bytes: int = 4
    ) -> PassSizing:
        """The sizing of a group of `world_size` ranks of `shape` on a base of `config_json` (None: unknown, so every
        datum is taken to run whole and nothing is estimated), in a dtype of `dtype_bytes`."""
        if config_json is None:
            return cls(shape, DatumLayout(world_size, 1, shape.sequence_parallel_min_tokens))
        size, unsplit = sequence_parallel_size(config_json, shape.sequence_parallel, world_size)
        estimate: ActivationBytes | None
        try:
            estimate_activation_bytes(config_json, 1, dtype_bytes, shape.recomputes_activations())
        except (KeyError, TypeError, ValueError):  # a config without the sizes of a Llama-style decoder
            estimate = None
        else:
            checkpointing = shape.recomputes_activations()
            estimate = partial(
                estimate_activation_bytes, config_json, dtype_bytes=dtype_bytes, checkpointing=checkpointing
            )
        return cls(shape, DatumLayout(world_size, size, shape.sequence_parallel_min_tokens), estimate, unsplit)

    def largest_pass_tokens(self, lengths: np.ndarray) -> int:
        """The tokens of the largest pass any rank runs for datums of `lengths` (padding included)."""
        return self.layout.largest_pass_tokens(lengths, self.shape.micro_batch_tokens)

    def remedies(self, lengths: np.ndarray, largest: int, backward: bool, *, weights: bool) -> list[str]:
        """What shrinks the largest pass (`largest` tokens) of a forward(_backward) of datums of `lengths`, or the
        memory its activations take; `weights`: also what frees memory the base's weights hold."""
        shape, layout = self.shape, self.layout
        split_share = (lengths + layout.sequence_parallel - 1) // layout.sequence_parallel
        shares = np.where(layout.split(lengths), split_share, lengths)  # each datum's own pass
        remedies = []
        if largest > int(shares.max(initial=0)):
            remedies.append(
                f"lower trainer.micro_batch_tokens (now {shape.micro_batch_tokens}; a pass then holds fewer datums)"
            )
        elif len(lengths):  # one datum's pass: the datum whole, or its share of it
            remedies += self._split_remedies(int(lengths[int(np.argmax(shares))]))
        if backward and not shape.recomputes_activations():
            remedies.append("set trainer.activation_checkpointing: true")
        if weights and not shape.shards_base() and layout.world_size > 1:
            remedies.append("set trainer.sharding: fsdp (each rank then holds 1/num_workers of the base's weights)")
        if shape.dtype == "float32":
            remedies.append("set trainer.dtype: bfloat16 (half the memory)")
        return remedies

    def _split_remedies(self, length: int) -> list[str]:
        """For a largest pass that is one datum of `length` tokens: shorter datums, or more ranks to split it across."""
        layout, requested = self.layout, self.shape.sequence_parallel
        size, width, min_tokens = layout.sequence_parallel, layout.world_size, layout.min_tokens
        remedies = ["send shorter datums"]
        if length <= min_tokens:
            if size > 1:
                remedies.append(
                    f"lower trainer.sequence_parallel_min_tokens (now {min_tokens}) below {length}: such a datum is "
                    f"then split across {size} ranks"
                )
        elif self.unsplit:
            remedies = [f"send shorter datums (no datum is split across ranks on this base: {self.unsplit})"]
        elif size > 1 and requested is None:
            remedies.append(
                f"raise trainer.num_workers (now {width}): a datum of more than {min_tokens} tokens is split across "
                f"all of them, ceil({length} / num_workers) tokens a rank (now {math.ceil(length / size)})"
            )
        elif size > 1:
            where = f"trainer.num_workers (now {width}) with it" if size == width else "a larger divisor of num_workers"
            remedies.append(
                f"raise trainer.sequence_parallel (now {size}; {where}): a rank runs ceil({length} / "
                f"sequence_parallel) tokens of a split datum (now {math.ceil(length / size)})"
            )
        elif requested == 1 and width > 1:
            remedies.append(
                f"set trainer.sequence_parallel (now 1) to a divisor of trainer.num_workers ({width}), or leave it "
                f"unset for all of them: a datum of more than {min_tokens} tokens is then split across that many ranks"
            )
        elif width == 1:
            remedies.append(
                "raise trainer.num_workers (now 1) with trainer.sequence_parallel unset: a datum of more than "
                f"{min_tokens} tokens is then split across all of them"
            )
        return remedies


def size_text(num_bytes: int) -> str:
    """`num_bytes` for people: GiB from 1 GiB, else MiB."""
    return f"{num_bytes / 2**30:.1f} GiB" if num_bytes >= 2**30 else f"{max(1, round(num_bytes / 2**20))} MiB"
