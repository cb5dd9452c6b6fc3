"""Everything that crosses the ingress -> Trainer -> workers hops, and what comes back.

Plain dataclasses with no torch behind them, so the ingress imports this module and stays light. The
ingress sends operations (what the user asked for, validated); the Trainer turns each into worker
commands and builds its reply itself (app.trainer.operations); ranks answer each command with a value
or a CommandError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import TYPE_CHECKING, Any

import numpy as np

from app.db.checkpoints import CheckpointRecord
from app.training.batch import PackedBatch
from app.training.custom_loss import CustomLossProgram

if TYPE_CHECKING:
    import ray


@dataclass(frozen=True)
class AdapterSpec:
    """A model's trainable parts: a LoRA adapter on the shared base, plus a value head for a critic."""

    rank: int
    seed: int
    train_attn: bool = True
    train_mlp: bool = True
    alpha: float = 32.0
    role: str = "policy"  # "critic": the model also has a scalar value head and predicts values
    optimizer: str = "adamw"  # or "dimuon": fixed at creation (optimizer_config), kept by full-state checkpoints

    def adapted(self) -> str:
        """Which layers the adapter adapts (which modules that is, per model family: app.models.families). The
        unembedding (lm_head) never is: vLLM samplers refuse lm_head LoRAs, and sampler logprobs must equal the
        trainer's."""
        return " and ".join(name for name, on in (("attention", self.train_attn), ("MLP", self.train_mlp)) if on)


@dataclass(frozen=True)
class AdamParams:
    """Adam hyper-parameters as Tinker sends them with every optim_step."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0  # 0 = no clipping


@dataclass(frozen=True)
class DimuonParams:
    """Dimuon hyper-parameters as Tinker sends them with every optim_step (app.training.dimuon)."""

    learning_rate: float
    grad_clip_norm: float = 0.0  # <= 0: no clipping
    beta1: float = 0.9


OptimParams = AdamParams | DimuonParams


# ---- ingress -> Trainer: operations, each answered through its future (request_id) ----


@dataclass(frozen=True)
class ForwardBackwardArgs:
    loss_fn: str  # the loss to run, already resolved for the model's role
    loss_config: dict[str, float]  # with defaults filled in
    forward_only: bool
    batch: PackedBatch | ray.ObjectRef  # an ObjectRef once shipped to the workers
    custom_loss: CustomLossProgram | None = None  # loss_fn "custom": the stored loss the request names


@dataclass(frozen=True)
class ForwardBackward:
    request_id: str
    args: ForwardBackwardArgs


@dataclass(frozen=True)
class OptimStep:
    request_id: str
    params: OptimParams


@dataclass(frozen=True)
class SaveCheckpoint:
    """Write the model's weights as the checkpoint `record` (its path's kind says what is written), then make it
    visible, replacing one of the same name only with `overwrite`."""

    request_id: str
    record: CheckpointRecord
    overwrite: bool = False


@dataclass(frozen=True)
class SaveForSampler:
    """Write the model's adapter at `location` for the ephemeral sampling session `sampling_session_id`."""

    request_id: str
    sampling_session_id: str
    location: str


@dataclass(frozen=True)
class LoadCheckpoint:
    """Fill the model from the training checkpoint `path` stored at `location`."""

    request_id: str
    path: str  # tinker://
    location: str
    with_optimizer: bool


@dataclass(frozen=True)
class Skip:
    """A seq_id whose request was rejected at the ingress (its future already failed); it only advances order."""

    request_id: str


SequencedOp = ForwardBackward | OptimStep | SaveCheckpoint | SaveForSampler | LoadCheckpoint | Skip


@dataclass(frozen=True)
class CreateModel:
    """Create a model (its seq_id 0); with `load`, fill it from a checkpoint in the same step."""

    request_id: str
    spec: AdapterSpec
    load: LoadCheckpoint | None = None


# ---- Trainer -> workers: commands every rank runs, in the order sent ----


class CommandKind(StrEnum):
    CREATE_MODEL = "create_model"
    REMOVE_MODEL = "remove_model"
    FORWARD_BACKWARD = "forward_backward"
    OPTIM_STEP = "optim_step"
    SAVE_ADAPTER = "save_adapter"  # the PEFT adapter (what samplers load)
    SAVE_STATE = "save_state"  # adapter, value head, optimizer state and spec (what load_state reads)
    SAVE_EXPORT = "save_export"  # a download: a policy's adapter, or a critic's whole state
    LOAD_STATE = "load_state"
    SNAPSHOT = "snapshot"  # rank 0 copies adapter + optimizer state and writes it to `location` on a thread
    PING = "ping"


@dataclass(frozen=True)
class Command:
    kind: CommandKind
    model_id: str = ""
    spec: AdapterSpec | None = None
    fwdbwd: ForwardBackwardArgs | None = None
    optim: OptimParams | None = None
    location: str = ""  # SAVE_*, LOAD_STATE, SNAPSHOT: the checkpoint's storage location
    with_optimizer: bool = False  # LOAD_STATE: restore the optimizer state too
    request_id: str = ""  # the future it serves (a cancelled one is dropped while no rank has taken it)


@dataclass(frozen=True)
class ShardOutput:
    """A rank's answer to FORWARD_BACKWARD: its datum indices and their flat per-token outputs."""

    datum_indices: np.ndarray
    offsets: np.ndarray
    outputs: dict[str, np.ndarray]
    loss_sum: float
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)  # the loss's metrics: name -> (sum, count)
    # a custom loss's estimated compute over the whole request, in tokens of the base's training (what it costs in
    # the fair share beyond the request's tokens)
    loss_cost_tokens: int = 0


@dataclass(frozen=True)
class CommandError:
    """A command that raised on a rank; `error` is the failed-future body."""

    error: dict[str, Any]
