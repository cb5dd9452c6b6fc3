"""Per-request bounds of a forward_backward body, checked before any datum is decoded.

A sparse CSR loss input costs the same few bytes on the wire whatever its width, so the codec first adds up every
loss input's cells from its declared shape (a CSR one as it will be densified) and refuses the request when they
exceed one budget; only then does it allocate anything.
"""

from __future__ import annotations

from app.errors import LimitExceeded

__all__ = ["CellBudget", "check_datum_count"]


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
