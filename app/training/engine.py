"""One rank's training engine: a base model, its LoRA adapters, their optimizers, and the math.

Pure torch: it runs the same inside a Ray Train worker or a unit test. With world_size > 1 each rank
takes every world_size-th datum and gradients are summed across ranks at optim_step (Tinker losses
are sums, so SUM is exact).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
from transformers import AutoModelForCausalLM

from app.errors import NotFound, UserError
from app.training.batch import PackedBatch
from app.training.losses import get_loss
from app.training.lora import AdapterPool, AdapterSpec
from app.training.optim import AdamParams, apply_step, make_optimizer


@dataclass(frozen=True)
class ShardOutput:
    """One rank's part of a forward(_backward): its datum indices and their flat per-token outputs."""

    datum_indices: np.ndarray
    offsets: np.ndarray
    outputs: dict[str, np.ndarray]
    loss_sum: float


def shard_indices(num_datums: int, rank: int, world_size: int) -> np.ndarray:
    return np.arange(rank, num_datums, world_size, dtype=np.int64)


def load_base_model(path: str, dtype: torch.dtype = torch.float32, device: str = "cpu") -> torch.nn.Module:
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return model.to(device).eval()


class TrainingEngine:
    def __init__(self, base: torch.nn.Module, *, rank: int = 0, world_size: int = 1, device: str = "cpu") -> None:
        self.rank = rank
        self.world_size = world_size
        self.device = torch.device(device)
        self.pool = AdapterPool(base)
        self._optimizers: dict[str, torch.optim.AdamW] = {}
        self._names: dict[str, str] = {}  # model_id -> adapter name (module keys cannot hold every model id)
        self._next_name = 0

    # -- adapters -----------------------------------------------------------------------------
    def create_model(self, model_id: str, spec: AdapterSpec) -> None:
        if model_id in self._names:
            return  # a retried command: the adapter exists already
        name = f"m{self._next_name}"
        self._next_name += 1
        params = self.pool.add(name, spec)
        self._names[model_id] = name
        self._optimizers[model_id] = make_optimizer(params)

    def remove_model(self, model_id: str) -> None:
        name = self._names.pop(model_id, None)
        if name is not None:
            self.pool.remove(name)
            self._optimizers.pop(model_id, None)

    def has_model(self, model_id: str) -> bool:
        return model_id in self._names

    def _name(self, model_id: str) -> str:
        name = self._names.get(model_id)
        if name is None:
            raise NotFound(f"model {model_id!r} is not loaded on this trainer (a worker restart loses models held "
                           "in memory): create it again or load a checkpoint", field="model_id")
        return name

    def _activate(self, model_id: str) -> str:
        name = self._name(model_id)
        self.pool.activate(name)
        return name

    # -- compute ------------------------------------------------------------------------------
    def forward_backward(
        self, model_id: str, loss_fn: str, config: dict[str, float], batch: PackedBatch, forward_only: bool
    ) -> ShardOutput:
        """Run this rank's shard; gradients accumulate until optim_step."""
        self._activate(model_id)
        spec = get_loss(loss_fn)
        indices = shard_indices(batch.num_datums, self.rank, self.world_size)
        shard = batch.select(indices)
        if shard.num_datums == 0:
            return ShardOutput(indices, shard.offsets, {}, 0.0)
        with torch.set_grad_enabled(not forward_only):
            target_lp = self._target_logprobs(shard)
            inputs = {k: torch.from_numpy(v).to(self.device) for k, v in shard.loss_inputs.items() if k != "target_tokens"}
            datum_ids = torch.repeat_interleave(torch.arange(shard.num_datums), torch.from_numpy(shard.lengths))
            loss, elementwise = spec.fn(target_lp, inputs, config, datum_ids.to(self.device))
            if not forward_only:
                loss.backward()
        outputs = {
            "logprobs": target_lp.detach().to(torch.float32).cpu().numpy(),
            "elementwise_loss": elementwise.detach().to(torch.float32).cpu().numpy(),
        }
        return ShardOutput(indices, shard.offsets, outputs, float(loss.detach()))

    def _target_logprobs(self, shard: PackedBatch) -> torch.Tensor:
        """Log-probabilities of target_tokens, flat over the shard: [T] or [T, K]."""
        lengths = shard.lengths
        max_len = int(lengths.max())
        n = shard.num_datums
        input_ids = torch.zeros((n, max_len), dtype=torch.long)
        mask = torch.zeros((n, max_len), dtype=torch.long)
        for i in range(n):
            s = shard.datum_slice(i)
            input_ids[i, : lengths[i]] = torch.from_numpy(shard.tokens[s])
            mask[i, : lengths[i]] = 1
        mask = mask.to(self.device)
        logits = self.pool.model(input_ids=input_ids.to(self.device), attention_mask=mask).logits
        valid = mask.bool()
        flat_logits = logits[valid].float()  # [T, V], datums in order
        log_norm = torch.logsumexp(flat_logits, dim=-1)
        targets = torch.from_numpy(shard.loss_inputs["target_tokens"]).to(self.device).long()
        if targets.dim() == 1:
            return flat_logits.gather(1, targets[:, None]).squeeze(1) - log_norm
        return flat_logits.gather(1, targets) - log_norm[:, None]

    def optim_step(self, model_id: str, hp: AdamParams) -> dict[str, float]:
        name = self._activate(model_id)
        params = self.pool.parameters(name)
        if self.world_size > 1:
            _all_reduce_sum_grads(params)
        norm = apply_step(self._optimizers[model_id], params, hp)
        return {"grad_norm:mean": norm}

    def save_adapter(self, model_id: str, directory: str) -> None:
        """Write the model's adapter as a PEFT adapter directory (rank 0 only; ranks hold identical
        weights). The directory appears complete or not at all."""
        if self.rank != 0:
            return
        name = self._name(model_id)
        target = Path(directory)
        if target.exists():
            raise UserError(f"checkpoint {target.name!r} already exists for this model; choose another name",
                            field="path")
        target.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=f".{target.name}.") as tmp:
            self.pool.model.save_pretrained(tmp, selected_adapters=[name])
            os.rename(Path(tmp) / name, target)  # PEFT writes non-default adapters into a subfolder

    def adapter_state(self, model_id: str) -> dict[str, torch.Tensor]:
        """The adapter's parameters by name (for tests and snapshots)."""
        name = self._names[model_id]
        return {n: p.detach().clone() for n, p in self.pool.model.named_parameters() if f".{name}." in n}



def _all_reduce_sum_grads(params: list[torch.nn.Parameter]) -> None:
    """Sum every rank's gradients of `params` with one collective over a flat buffer."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()
