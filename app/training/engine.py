"""One rank's training engine: a base model, its LoRA adapters, their optimizers, and the math.

Pure torch: it runs the same inside a Ray Train worker or a unit test. With world_size > 1 each rank
takes every world_size-th datum and gradients are summed across ranks at optim_step (Tinker losses
are sums, so SUM is exact).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from app.errors import NotFound, UserError
from app.messages import AdapterSpec, OptimParams, ShardOutput
from app.training import checkpoint
from app.training.batch import PackedBatch
from app.training.custom_loss import CustomLossProgram
from app.training.custom_loss.interpreter import run_custom_loss
from app.training.logprobs import target_logprobs
from app.training.lora import AdapterPool
from app.training.losses import get_loss
from app.training.losses.functions import LOSS_FUNCTIONS, LOSS_STATS
from app.training.optim import apply_step, make_optimizer


def shard_indices(num_datums: int, rank: int, world_size: int) -> np.ndarray:
    return np.arange(rank, num_datums, world_size, dtype=np.int64)


def load_base_model(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.nn.Module:
    model: torch.nn.Module = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


@dataclass
class _Model:
    """One trained model on this rank: its adapter's module name, trainable parameters and optimizer."""

    name: str  # module keys cannot hold every model id
    spec: AdapterSpec
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer  # AdamW or Dimuon, as spec.optimizer says
    value_head: torch.nn.Linear | None  # critics only


class TrainingEngine:
    def __init__(self, base: torch.nn.Module, *, rank: int = 0, world_size: int = 1, device: str = "cpu") -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.pool = AdapterPool(base)
        self._models: dict[str, _Model] = {}
        self._next_name = 0

    # -- adapters -----------------------------------------------------------------------------
    def create_model(self, model_id: str, spec: AdapterSpec) -> None:
        if model_id in self._models:
            return  # a retried command: the adapter exists already
        name = f"m{self._next_name}"
        self._next_name += 1
        params = self.pool.add(name, spec)
        head = self._value_head() if spec.role == "critic" else None
        if head is not None:
            params = [*params, *head.parameters()]
        self._models[model_id] = _Model(name, spec, params, make_optimizer(params, spec.optimizer), head)

    def _value_head(self) -> torch.nn.Linear:
        """A scalar head on the final hidden state, in float32; zero-initialised, so new critics predict 0."""
        head = torch.nn.Linear(self.pool.model.config.hidden_size, 1, device=self.device, dtype=torch.float32)
        torch.nn.init.zeros_(head.weight)
        torch.nn.init.zeros_(head.bias)
        return head

    def remove_model(self, model_id: str) -> None:
        model = self._models.pop(model_id, None)
        if model is not None:
            self.pool.remove(model.name)

    def require_model(self, model_id: str) -> None:
        """NotFound unless the model is loaded here."""
        self._model(model_id)

    def _model(self, model_id: str) -> _Model:
        model = self._models.get(model_id)
        if model is None:
            raise NotFound(
                f"model {model_id!r} is not loaded on this trainer (a worker restart loses models held "
                "in memory): create it again or load a checkpoint",
                field="model_id",
            )
        return model

    def _activate(self, model_id: str) -> _Model:
        model = self._model(model_id)
        self.pool.activate(model.name)
        return model

    # -- compute ------------------------------------------------------------------------------
    def forward_backward(
        self,
        model_id: str,
        loss_fn: str,
        config: dict[str, float],
        batch: PackedBatch,
        forward_only: bool,
        custom: CustomLossProgram | None = None,
    ) -> ShardOutput:
        """Run this rank's shard; gradients accumulate until optim_step. A policy outputs `logprobs` of
        the target tokens, a critic `values`; both `elementwise_loss` when the loss's inputs were sent.
        A custom loss (`custom`, loss_fn "custom") runs through its interpreter and reports its own metrics."""
        model = self._activate(model_id)
        if custom is not None:
            return self._custom_forward_backward(model_id, custom, batch, forward_only)
        spec = get_loss(loss_fn)
        indices = shard_indices(batch.num_datums, self.rank, self.world_size)
        shard = batch.select(indices)
        if shard.num_datums == 0:
            return ShardOutput(indices, shard.offsets, {}, 0.0)
        with torch.set_grad_enabled(not forward_only):
            input_ids, mask = self._padded(shard)
            # Every host-to-device copy before the forward: a blocking copy waits for the work queued ahead of it.
            loss_inputs = self._loss_inputs(shard) if spec.required_inputs <= shard.loss_inputs.keys() else None
            if model.value_head is None:
                output_name, prediction = "logprobs", self._target_logprobs(shard, input_ids, mask)
            else:
                output_name, prediction = "values", self._values(model.value_head, shard, input_ids, mask)
            outputs = {output_name: prediction}
            loss, stats = torch.zeros(()), {}
            if loss_inputs is not None:  # a critic's forward may ask for values only
                inputs, datum_ids = loss_inputs
                loss, outputs["elementwise_loss"] = LOSS_FUNCTIONS[loss_fn](prediction, inputs, config, datum_ids)
                stats = LOSS_STATS[loss_fn](prediction, inputs, config) if loss_fn in LOSS_STATS else {}
                if not forward_only:
                    loss.backward()
        arrays = {k: v.detach().to(torch.float32).cpu().numpy() for k, v in outputs.items()}
        return ShardOutput(indices, shard.offsets, arrays, float(loss.detach()), stats)

    def _custom_forward_backward(
        self, model_id: str, program: CustomLossProgram, batch: PackedBatch, forward_only: bool
    ) -> ShardOutput:
        indices = shard_indices(batch.num_datums, self.rank, self.world_size)
        shard = batch.select(indices)
        if shard.num_datums == 0:
            return ShardOutput(indices, shard.offsets, {}, 0.0)
        with torch.set_grad_enabled(not forward_only):
            inputs = {name: torch.from_numpy(shard.loss_inputs[name]).to(self.device) for name in program.input_names}
            logprobs = self._target_logprobs(shard, *self._padded(shard))
            loss, stats = run_custom_loss(program, logprobs, inputs, shard.offsets)
            if not forward_only:
                loss.backward()
        outputs = {"logprobs": logprobs.detach().cpu().numpy()}
        return ShardOutput(indices, shard.offsets, outputs, float(loss.detach()), stats)

    def _padded(self, shard: PackedBatch) -> tuple[torch.Tensor, torch.Tensor]:
        """The shard's datums as right-padded input ids and their attention mask, both [N, max_len]."""
        lengths = shard.lengths
        input_ids = torch.zeros((shard.num_datums, int(lengths.max())), dtype=torch.long)
        mask = torch.zeros_like(input_ids)
        for i in range(shard.num_datums):
            input_ids[i, : lengths[i]] = torch.from_numpy(shard.tokens[shard.datum_slice(i)])
            mask[i, : lengths[i]] = 1
        return input_ids.to(self.device), mask.to(self.device)

    def _loss_inputs(self, shard: PackedBatch) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The loss's inputs but target_tokens, and the datum index of every token, on the device."""
        inputs = {k: torch.from_numpy(v).to(self.device) for k, v in shard.loss_inputs.items() if k != "target_tokens"}
        datum_ids = torch.repeat_interleave(torch.arange(shard.num_datums), torch.from_numpy(shard.lengths))
        return inputs, datum_ids.to(self.device)

    def _target_logprobs(self, shard: PackedBatch, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """Log-probabilities of target_tokens, flat over the shard: [T] or [T, K]."""
        targets = torch.from_numpy(shard.loss_inputs["target_tokens"]).to(self.device).long()
        logits = self.pool.model(input_ids=input_ids, attention_mask=mask).logits
        return target_logprobs(_unpadded(logits, shard.lengths), targets)

    def _values(
        self, head: torch.nn.Linear, shard: PackedBatch, input_ids: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """The critic's value of each position (after reading that token), flat over the shard: [T].
        Runs the adapted backbone only, skipping the vocabulary projection."""
        backbone = cast(torch.nn.Module, self.pool.model.get_base_model().base_model)  # a submodule, not a tensor
        hidden = backbone(input_ids=input_ids, attention_mask=mask).last_hidden_state
        return head(_unpadded(hidden, shard.lengths).float()).squeeze(-1)

    def optim_step(self, model_id: str, hp: OptimParams) -> dict[str, float]:
        model = self._activate(model_id)
        if self.world_size > 1:
            _all_reduce_sum_grads(model.params)
        norm = apply_step(model.optimizer, model.params, hp)
        return {"grad_norm:mean": norm}

    # -- checkpoints: `out` is a directory to create, `directory` a local one to read -----------------
    def save_adapter(self, model_id: str, out: Path) -> None:
        """Write the model's adapter as a PEFT adapter directory (what samplers load)."""
        checkpoint.write_adapter(self.pool.model, self._model(model_id).name, out)

    def save_state(self, model_id: str, out: Path) -> None:
        """Write a training checkpoint: adapter, value head, optimizer state and spec."""
        model = self._model(model_id)
        checkpoint.write_state(self.pool.model, model.name, model.spec, model.value_head, model.optimizer, out)

    def save_export(self, model_id: str, out: Path) -> None:
        """Write a download: a policy's PEFT adapter (Hugging Face format), or a critic's whole training state
        (its value head and spec are part of it)."""
        save = self.save_state if self._model(model_id).spec.role == "critic" else self.save_adapter
        save(model_id, out)

    def capture_state(self, model_id: str) -> checkpoint.TrainingState:
        """A copy of the model's adapter, value head, optimizer state and spec (a snapshot to write)."""
        model = self._model(model_id)
        return checkpoint.capture_state(self.pool.model, model.name, model.spec, model.value_head, model.optimizer)

    def load_state(self, model_id: str, directory: Path, with_optimizer: bool) -> None:
        """Replace the model's weights (and optimizer state, or else a fresh optimizer) with a checkpoint's.
        Its spec must match the model's: same rank, adapted layers and role."""
        model = self._model(model_id)
        saved = checkpoint.read_spec(directory)
        if (saved.rank, saved.target_modules(), saved.role, saved.alpha) != (
            model.spec.rank,
            model.spec.target_modules(),
            model.spec.role,
            model.spec.alpha,
        ):
            raise UserError(
                f"the checkpoint holds a rank-{saved.rank} {saved.role} adapting "
                f"{saved.target_modules()}; this model is a rank-{model.spec.rank} {model.spec.role} "
                f"adapting {model.spec.target_modules()}",
                field="path",
            )
        if with_optimizer and saved.optimizer != model.spec.optimizer:
            raise UserError(
                f"the checkpoint's optimizer state is {saved.optimizer}'s; this model uses {model.spec.optimizer}",
                field="path",
            )
        if not with_optimizer:
            model.optimizer = make_optimizer(model.params, model.spec.optimizer)
        checkpoint.load_state(
            self.pool.model,
            model.name,
            model.value_head,
            model.optimizer if with_optimizer else None,
            directory,
            self.device,
        )
        for p in model.params:
            p.grad = None

    def adapter_state(self, model_id: str) -> dict[str, torch.Tensor]:
        """The model's trainable parameters by name, value head included (tests compare them)."""
        model = self._model(model_id)
        state = {n: p.detach().clone() for n, p in self.pool.model.named_parameters() if f".{model.name}." in n}
        if model.value_head is not None:
            state.update({f"value_head.{n}": p.detach().clone() for n, p in model.value_head.named_parameters()})
        return state


def _unpadded(padded: torch.Tensor, lengths: np.ndarray) -> torch.Tensor:
    """The rows of right-padded `padded` [N, L, ...] that hold tokens, datums in order: [sum(lengths), ...]. What
    `padded[mask.bool()]` gives, without the device sync of a boolean index, and a view when nothing is padded."""
    n, width = padded.shape[:2]
    flat = padded.reshape(n * width, *padded.shape[2:])
    if bool((lengths == width).all()):
        return flat
    rows = np.concatenate([i * width + np.arange(length) for i, length in enumerate(lengths)])
    return flat.index_select(0, torch.from_numpy(rows).to(padded.device))


def _all_reduce_sum_grads(params: list[torch.nn.Parameter]) -> None:
    """Sum every rank's gradients of `params` with one collective over a flat buffer."""
    grads: list[torch.Tensor] = []
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
        grads.append(p.grad)
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
