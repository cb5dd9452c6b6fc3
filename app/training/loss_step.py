"""A forward(_backward) request's loss, applied pass by pass (app.training.engine runs a rank's datums in
micro-batches), and what the passes give back joined into the rank's answer."""

from __future__ import annotations

import logging
from collections.abc import Callable

import numpy as np
import torch

from app.errors import ServerError, TinkerServeError
from app.training.custom_loss.interpreter import Planner, run_custom_loss
from app.training.losses.functions import LOSS_FUNCTIONS, LOSS_STATS
from app.training_data.batch import PackedBatch
from app.training_data.custom_losses import CustomLossProgram
from app.training_data.losses import get_loss

logger = logging.getLogger("tinker_serve.worker")

Stats = dict[str, tuple[float, float]]  # a loss's metrics: name -> (sum, count)
LossResult = tuple[torch.Tensor, dict[str, torch.Tensor], Stats]  # the summed loss, extra outputs, metrics


class LossStep:
    """The loss of one forward(_backward) request, applied to it micro-batch by micro-batch."""

    def __init__(
        self,
        loss_fn: str,
        config: dict[str, float],
        custom: CustomLossProgram | None,
        device: torch.device,
        batch: PackedBatch,
    ) -> None:
        """`batch`: the whole request (every rank's datums), whose custom loss is planned against the limits here,
        before any pass runs; a refusal (or running out of limits.max_custom_loss_seconds) fails each pass's loss,
        so every rank runs its passes alike."""
        self._planner = None if custom is None else _planner(custom, batch)
        self._loss_fn = loss_fn
        self._config = config
        self._custom = custom
        self._required = None if custom is not None else get_loss(loss_fn).required_inputs
        self._device = device

    @property
    def flops(self) -> int:
        """A custom loss's FLOPs over the whole request, as estimated before it ran (0 for a built-in loss)."""
        return 0 if self._planner is None else self._planner.estimated_flops

    def applies(self, batch: PackedBatch) -> bool:
        """Whether the batch sent the loss's inputs (a critic's forward may send none: values only)."""
        return self._required is None or self._required <= batch.loss_inputs.keys()

    def prepare(self, part: PackedBatch) -> Callable[[torch.Tensor], LossResult] | None:
        """Copy the part's loss inputs to the device; returns what computes the loss from the model's predictions
        (None: the inputs were not sent, so there is no loss)."""
        if not self.applies(part):
            return None
        custom, planner = self._custom, self._planner
        if custom is not None and planner is not None:
            named = {name: torch.from_numpy(part.loss_inputs[name]).to(self._device) for name in custom.input_names}

            def run_program(prediction: torch.Tensor) -> LossResult:
                loss, stats = run_custom_loss(custom, prediction, named, part.offsets, planner)
                return loss, {}, stats

            return run_program
        inputs = {k: torch.from_numpy(v).to(self._device) for k, v in part.loss_inputs.items() if k != "target_tokens"}
        datum_ids = torch.repeat_interleave(torch.arange(part.num_datums), torch.from_numpy(part.lengths))
        datum_ids = datum_ids.to(self._device)

        def finish(prediction: torch.Tensor) -> LossResult:
            loss, elementwise = LOSS_FUNCTIONS[self._loss_fn](prediction, inputs, self._config, datum_ids)
            stats = LOSS_STATS[self._loss_fn](prediction, inputs, self._config) if self._loss_fn in LOSS_STATS else {}
            return loss, {"elementwise_loss": elementwise}, stats

        return finish


def _planner(custom: CustomLossProgram, batch: PackedBatch) -> Planner:
    """The custom loss planned for the request: logprobs per token have target_tokens' shape (float32)."""
    logprobs = (batch.loss_inputs["target_tokens"].shape[1:], torch.float32)
    arrays = [batch.loss_inputs[name] for name in custom.input_names]
    inputs = [(a.shape[1:], torch.from_numpy(np.empty(0, a.dtype)).dtype) for a in arrays]
    planner = Planner(custom, [logprobs, *inputs])
    planner.check(batch.lengths)
    return planner


def loss_error(loss_fn: str, error: Exception) -> TinkerServeError:
    """A loss's failure as the command's error. The passes all ran, so the ranks are in step: an unexpected exception
    is reported (and logged) as a server error rather than raised as one, which ends a sharded rank."""
    if isinstance(error, TinkerServeError):
        return error
    logger.error("loss %s failed on this rank's datums", loss_fn, exc_info=error)
    return ServerError(f"loss {loss_fn} failed on a worker: {type(error).__name__}: {error}")


def joined(
    parts: list[tuple[dict[str, np.ndarray], float, Stats]],
) -> tuple[dict[str, np.ndarray], float, Stats]:
    """The micro-batches' outputs concatenated in datum order, their losses summed, their metrics merged."""
    names = parts[0][0].keys() if parts else ()
    outputs = {name: np.concatenate([p[0][name] for p in parts]) for name in names}
    stats: Stats = {}
    for _, _, part_stats in parts:
        for name, (total, count) in part_stats.items():
            before = stats.get(name, (0.0, 0.0))
            stats[name] = (before[0] + total, before[1] + count)
    return outputs, float(sum(p[1] for p in parts)), stats
