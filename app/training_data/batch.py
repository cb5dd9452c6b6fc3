"""Datums of one forward/forward_backward request packed as flat numpy arrays.

A batch travels from the ingress to the workers (a large one through the object store); flat arrays keep that cheap.
Datum i owns rows ``offsets[i]:offsets[i+1]`` of ``tokens`` and of every array in ``loss_inputs``. An image chunk
holds IMAGE_PLACEHOLDER at each of its positions in ``tokens``, and its bytes in ``images`` (decoded on the ranks).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

IMAGE_PLACEHOLDER = -1  # an image's positions in PackedBatch.tokens, until a rank puts the base's image token there


@dataclass(frozen=True)
class BatchImage:
    """An image chunk of datum `datum`: its encoded bytes at positions [position, position + tokens) of the datum;
    `field` names the chunk in the request (``data[0].model_input[1]``)."""

    field: str
    datum: int
    position: int
    tokens: int
    format: str
    data: bytes


@dataclass(frozen=True)
class PackedBatch:
    tokens: np.ndarray  # int64 [total_tokens]: every datum's model input, concatenated
    offsets: np.ndarray  # int64 [num_datums + 1], offsets[0] == 0
    loss_inputs: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [total_tokens, *trailing]
    images: tuple[BatchImage, ...] = ()  # in datum order, then position order

    @property
    def num_datums(self) -> int:
        return len(self.offsets) - 1

    @property
    def num_tokens(self) -> int:
        """Every datum's tokens together: what a forward(_backward) costs, trains on and counts as usage."""
        return int(self.offsets[-1])

    @property
    def nbytes(self) -> int:
        """The arrays' size in bytes."""
        arrays = self.tokens.nbytes + self.offsets.nbytes + sum(a.nbytes for a in self.loss_inputs.values())
        return arrays + sum(len(image.data) for image in self.images)

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def datum_slice(self, i: int) -> slice:
        return slice(int(self.offsets[i]), int(self.offsets[i + 1]))

    def select(self, datum_indices: np.ndarray | list[int]) -> PackedBatch:
        """The sub-batch of the given datums, in the given order."""
        slices = [self.datum_slice(int(i)) for i in datum_indices]
        lengths = np.array([s.stop - s.start for s in slices], dtype=np.int64)
        offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)

        def gather(a: np.ndarray) -> np.ndarray:
            if not slices:
                return a[:0]
            return np.concatenate([a[s] for s in slices])

        by_datum: dict[int, list[BatchImage]] = {}
        for image in self.images:
            by_datum.setdefault(image.datum, []).append(image)
        images = [
            replace(image, datum=new) for new, old in enumerate(datum_indices) for image in by_datum.get(int(old), ())
        ]
        return PackedBatch(
            gather(self.tokens), offsets, {k: gather(v) for k, v in self.loss_inputs.items()}, tuple(images)
        )


@dataclass(frozen=True)
class Span:
    """A run of a datum's positions that names its source: `length` consecutive tokens from position `offset` of
    the sequence `sequence_id`'s sampled tokens (`sampled`) or of the prompt that sampled it."""

    sampled: bool
    sequence_id: str
    offset: int
    length: int


@dataclass(frozen=True)
class Provenance:
    """A datum's spans: tiling its model_input, and tiling its loss_fn_inputs["target_tokens"]."""

    model_input: tuple[Span, ...]
    loss_fn_inputs: tuple[Span, ...]


@dataclass(frozen=True)
class ForwardBackwardInput:
    """A decoded forward / forward_backward request."""

    model_id: str
    seq_id: int
    loss_fn: str
    loss_fn_config: dict[str, float | str]
    forward_only: bool
    batch: PackedBatch
    provenance: tuple[Provenance | None, ...] = ()  # per datum (None: no spans); empty when no datum has any


@dataclass(frozen=True)
class ForwardBackwardResult:
    """Per-datum outputs (flat, aligned with the batch's offsets) plus summed metrics."""

    offsets: np.ndarray  # int64 [num_datums + 1]
    outputs: dict[str, np.ndarray]  # name -> [total_tokens, *trailing] float32
    metrics: dict[str, float]
    loss_fn_output_type: str = "ArrayRecord"
