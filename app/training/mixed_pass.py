"""Several models' forward(_backward)s on one base as one pass (app.training.engine.TrainingEngine.
forward_backward_many): the rows of every request's shard in one padded batch, each row through its own model's
adapter, the requests' losses summed into one backward. The adapters are distinct parameters, so each gradient
holds its own model's loss alone, and each request keeps its answer, metrics and failure to itself.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import torch

from app.errors import TinkerServeError
from app.messages import ForwardBackwardArgs, PassLayout, PassMember, ShardOutput
from app.training.grads import failed_on_any_rank, give_back_grads, take_grads
from app.training.loaded_model import LoadedModel
from app.training.logprobs import target_logprobs
from app.training.lora import AdapterPool
from app.training.loss_step import LossResult, LossStep, Stats, loss_error
from app.training.rows import padded, shard_indices, unpadded
from app.training_data.batch import PackedBatch


class PassEngine(Protocol):
    """What a mixed pass uses of its rank's engine (app.training.engine.TrainingEngine)."""

    device: torch.device
    rank: int
    world_size: int
    sharded: bool
    pool: AdapterPool
    token_flops: int

    def loaded(self, model_id: str) -> LoadedModel: ...

    def idle_pass(self, model: LoadedModel, forward_only: bool) -> None: ...

    def forward(self, input_ids: torch.Tensor, mask: torch.Tensor | None, **kwargs: Any) -> Any: ...

    def capturing_hidden(self) -> AbstractContextManager[list[torch.Tensor]]: ...


Finish = Callable[[torch.Tensor], LossResult] | None  # a request's loss on its predictions (None: no loss inputs)


@dataclass(eq=False)  # compared by identity
class _Request:
    """One request of the pass, once its model and loss are known, and its shard (its rows of the padded batch)."""

    model: LoadedModel
    args: ForwardBackwardArgs
    loss: LossStep
    indices: np.ndarray  # the request's datums on this rank
    shard: PackedBatch
    earlier: list[torch.Tensor | None] | None = None  # the gradients before this request (backward only)
    total: float = 0.0
    outputs: dict[str, np.ndarray] | None = None
    stats: Stats | None = None
    error: Exception | None = None


class MixedPass:
    """One pass of several requests, each of a different model (app.training.engine.TrainingEngine.mix)."""

    def __init__(self, engine: PassEngine, requests: Sequence[tuple[str, ForwardBackwardArgs]]) -> None:
        self._engine = engine
        self._failed: dict[int, TinkerServeError] = {}
        self._live: list[tuple[int, _Request]] = []
        for i, (model_id, args) in enumerate(requests):
            try:  # a model not loaded here, or a custom loss over its limits, fails that request alone
                model = engine.loaded(model_id)
                loss = LossStep(args.loss_fn, args.loss_config, args.custom_loss, engine.device, args.batch)
            except TinkerServeError as exc:
                self._failed[i] = exc
                continue
            indices = shard_indices(args.batch.num_datums, engine.rank, engine.world_size)
            self._live.append((i, _Request(model, args, loss, indices, args.batch.select(indices))))

    def run(self) -> list[ShardOutput | TinkerServeError]:
        """Each request's answer, in order."""
        requests = [r for _, r in self._live]
        learning = [r for r in requests if not r.args.forward_only and r.loss.applies(r.args.batch)]
        for r in learning:
            r.earlier = take_grads(r.model.params)
        try:
            self._pass(requests, learning)
        except Exception:
            for r in learning:  # a replicated base: the other ranks are not left waiting; drop what this added
                give_back_grads(r.model.params, r.earlier or [], keep_current=False)
            raise
        finally:
            for r in requests:  # as the engine keeps them (PEFT's set_adapter decides an adapter's own)
                for p in r.model.params:
                    p.requires_grad_(True)
        answers = self._settle(requests)
        return [self._failed[i] if i in self._failed else answers[i] for i in range(len(self._failed) + len(answers))]

    def _pass(self, requests: list[_Request], learning: list[_Request]) -> None:
        """The forward of every row, each request's outputs and loss, and one backward of the learning ones'."""
        engine, backward = self._engine, bool(learning)
        present = [r for r in requests if r.shard.num_datums]
        if not present:  # no datum of any request on this rank: a sharded base still joins the other ranks' pass
            if engine.sharded and requests:
                engine.idle_pass(requests[0].model, not backward)
            return
        input_ids, mask = padded([r.shard for r in present], engine.device)
        critics = any(r.model.value_head is not None for r in requests)
        runs = [(r.model.name, r.shard.num_datums) for r in present]
        # the backward inside too: a gradient reaches only a parameter that still requires it then
        with torch.set_grad_enabled(backward), engine.pool.segments(runs):
            # every copy to the device before the forward: a blocking copy waits for the work queued ahead of it
            finishes = [r.loss.prepare(r.shard) if r.shard.num_datums else None for r in requests]
            targets = [self._targets(r) for r in requests]
            for r in requests:  # the learning adapters take gradients (the others' rows would give them zeros)
                for p in r.model.params:
                    p.requires_grad_(r in learning)
            with engine.capturing_hidden() as hidden:
                logits = engine.forward(input_ids, mask).logits
            total = logits.sum() * 0 if engine.sharded else None  # every rank's backward gathers the same weights
            # each request's rows by one split (its backward is one concatenation; a slice's fills a whole copy)
            sizes = [r.shard.num_datums for r in requests]
            own_logits = logits.split(sizes)
            own_hidden = hidden[0].split(sizes) if critics else [None] * len(requests)
            for r, finish, r_targets, r_logits, r_hidden in zip(
                requests, finishes, targets, own_logits, own_hidden, strict=True
            ):
                loss = self._predict_and_loss(r, finish, r_targets, r_logits, r_hidden)
                if loss is not None and r in learning and (r.error is None or engine.sharded):
                    total = loss if total is None else total + loss
            if backward and total is not None:
                total.backward()

    def _targets(self, r: _Request) -> torch.Tensor | None:
        """A policy's target tokens on the device (None for a critic, or no datum here)."""
        if r.model.value_head is not None or not r.shard.num_datums:
            return None
        return torch.from_numpy(r.shard.loss_inputs["target_tokens"]).to(self._engine.device).long()

    def _predict_and_loss(
        self,
        r: _Request,
        finish: Finish,
        targets: torch.Tensor | None,
        logits: torch.Tensor,
        hidden: torch.Tensor | None,
    ) -> torch.Tensor | None:
        """The request's prediction and outputs from its rows' logits (or hidden states); its loss to backpropagate
        (None: no datum here, or no loss)."""
        if not r.shard.num_datums:
            r.outputs, r.stats = {}, {}
            return None
        lengths, head = r.shard.lengths, r.model.value_head
        if head is not None and hidden is not None:
            name, prediction = "values", head(unpadded(hidden, lengths).float()).squeeze(-1)
        else:
            assert targets is not None
            name, prediction = "logprobs", target_logprobs(unpadded(logits, lengths), targets)
        outputs: dict[str, torch.Tensor] = {name: prediction}
        loss: torch.Tensor | None = None
        stats: Stats = {}
        if finish is not None:
            try:
                loss, extra, stats = finish(prediction)
                outputs.update(extra)
            except Exception as exc:  # noqa: BLE001 - this request's failure, answered below
                r.error, loss = exc, prediction.sum() * 0
        r.outputs = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in outputs.items()}
        r.total, r.stats = (float(loss.detach()) if loss is not None else 0.0), stats
        return loss

    def _settle(self, requests: list[_Request]) -> dict[int, ShardOutput | TinkerServeError]:
        """Each request keeps its gradients unless it failed on any rank; its answer or error, by position."""
        engine = self._engine
        failed = failed_on_any_rank([r.error is not None for r in requests], engine.device)  # one collective
        answers: dict[int, ShardOutput | TinkerServeError] = {}
        members = tuple(PassMember(r.model.spec, r.args.batch.lengths) for r in requests)
        for own, ((i, r), lost) in enumerate(zip(self._live, failed, strict=True)):
            if r.earlier is not None:
                give_back_grads(r.model.params, r.earlier, keep_current=not lost)
            if r.error is not None:
                answers[i] = loss_error(r.args.loss_fn, r.error)
                continue
            cost = r.loss.flops // engine.token_flops
            layout = PassLayout(members, own)
            answers[i] = ShardOutput(r.indices, r.shard.offsets, r.outputs or {}, r.total, r.stats or {}, cost, layout)
        return answers
