"""Per-request bounds of a forward_backward body, checked before any datum is decoded.

Every count the body carries (datums, chunks, loss inputs, config entries, provenance spans, distinct sequence ids)
is bounded by a LimitsConfig field before anything is built from it (CountLimits, Counter).

A sparse CSR loss input costs the same few bytes on the wire whatever its width, so the codec first adds up every
loss input's cells from its declared shape (a CSR one as it will be densified) and refuses the request when they
exceed one budget; only then does it allocate anything.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from app.errors import LimitExceeded

__all__ = [
    "CellBudget",
    "CountLimits",
    "Counter",
    "check_config_entries",
    "check_datum_count",
    "check_distinct_ids",
    "over",
]


def check_datum_count(n: int, max_datums: int) -> None:
    if n > max_datums:
        raise LimitExceeded(
            f"data has {n} datums; the limit is limits.max_datums_per_request={max_datums}", field="data"
        )


class CellBudget:
    """The cells of one request's loss inputs, added up tensor by tensor against limits.max_loss_input_cells_per_
    request; a CSR tensor's width is bounded by limits.max_sparse_input_width."""

    def __init__(self, max_cells: int, max_sparse_width: int) -> None:
        self.max_cells, self.max_sparse_width, self.total = max_cells, max_sparse_width, 0

    def add_dense(self, field: str, cells: int) -> None:
        self._add(field, cells)

    def add_sparse(self, field: str, shape: list[int]) -> None:
        """A CSR tensor of `shape`; one that is not a valid 2-D shape is left to the decoder, which refuses it."""
        if len(shape) != 2 or min(shape) < 0:
            return
        rows, cols = shape
        if cols > (width := self.max_sparse_width):
            raise LimitExceeded(
                f"{field} is sparse CSR {cols} wide; the limit is limits.max_sparse_input_width={width}", field=field
            )
        self._add(field, rows * cols)

    def _add(self, field: str, cells: int) -> None:
        self.total += cells
        if self.total > self.max_cells:
            raise LimitExceeded(
                f"{field} brings the request's loss_fn_inputs to {self.total} cells; the limit is "
                f"limits.max_loss_input_cells_per_request={self.max_cells}",
                field=field,
            )


@dataclass(frozen=True)
class CountLimits:
    """How many of each repeated thing one forward_backward body may carry (LimitsConfig's fields of the same
    names), checked before anything is built from them: from the protobuf wire (app.protocol.skeleton) before the
    message is parsed, from a JSON body's lists before any is converted."""

    max_chunks_per_datum: int
    max_chunks_per_request: int
    max_loss_fn_inputs_per_datum: int
    max_loss_fn_config_entries: int
    max_provenance_spans_per_request: int
    max_distinct_sequence_ids_per_request: int
    max_images_per_request: int
    max_vision_tokens_per_datum: int

    @classmethod
    def of(cls, limits: Any) -> CountLimits:
        """The count limits of a LimitsConfig."""
        return cls(**{f.name: getattr(limits, f.name) for f in fields(cls)})


def over(field: str, what: str, count: int, name: str, limit: int) -> LimitExceeded:
    """The error for `count` of `what` at `field`, over limits.`name`=`limit`."""
    return LimitExceeded(f"{field} has {count} {what}; the limit is limits.{name}={limit}", field=field)


class Counter:
    """Running counts of one request's chunks, loss inputs and spans, refused at the first one over its limit (each
    call adds `n`: the JSON decoder adds a list at once, the protobuf scanner one field at a time)."""

    def __init__(self, limits: CountLimits) -> None:
        self.limits = limits
        self.chunks = self.spans = self.datum_chunks = self.datum_inputs = 0

    def next_datum(self) -> None:
        self.datum_chunks = self.datum_inputs = 0

    def add_chunks(self, i: int, n: int = 1) -> None:
        lim, field = self.limits, f"data[{i}].model_input.chunks"
        self.datum_chunks += n
        self.chunks += n
        if self.datum_chunks > lim.max_chunks_per_datum:
            raise over(field, "chunks", self.datum_chunks, "max_chunks_per_datum", lim.max_chunks_per_datum)
        if self.chunks > lim.max_chunks_per_request:
            limit = lim.max_chunks_per_request
            raise over(field, "chunks with the datums before it", self.chunks, "max_chunks_per_request", limit)

    def add_inputs(self, i: int, n: int = 1) -> None:
        self.datum_inputs += n
        if self.datum_inputs > (limit := self.limits.max_loss_fn_inputs_per_datum):
            raise over(f"data[{i}].loss_fn_inputs", "entries", self.datum_inputs, "max_loss_fn_inputs_per_datum", limit)

    def add_spans(self, field: str, n: int = 1) -> None:
        self.spans += n
        if self.spans > (limit := self.limits.max_provenance_spans_per_request):
            what = "provenance spans with the datums before it"
            raise over(field, what, self.spans, "max_provenance_spans_per_request", limit)


def check_config_entries(n: int, limits: CountLimits) -> None:
    """loss_fn_config's entries (with loss_fn_config_v2's)."""
    if n > (limit := limits.max_loss_fn_config_entries):
        raise over("loss_fn_config", "entries", n, "max_loss_fn_config_entries", limit)


def check_distinct_ids(field: str, n: int, limits: CountLimits) -> None:
    """The distinct sequence ids the spans name so far, `field` the span that brought them to `n`."""
    if n > (limit := limits.max_distinct_sequence_ids_per_request):
        what = "distinct sequence ids with the spans before it"
        raise over(field, what, n, "max_distinct_sequence_ids_per_request", limit)
