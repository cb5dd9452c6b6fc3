"""Everything that crosses the ingress -> Trainer -> workers hops, and what comes back.

Plain dataclasses with no torch behind them, so the ingress imports this module and stays light. The
ingress sends operations (what the user asked for, validated); the Trainer turns each into worker
commands and builds its reply itself (app.operations); ranks answer each command with a value
or a CommandError.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeGuard

import numpy as np

from app.training_data.batch import PackedBatch
from app.training_data.custom_losses import CustomLossProgram


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
    batch: PackedBatch
    custom_loss: CustomLossProgram | None = None  # loss_fn "custom": the stored loss the request names


@dataclass(frozen=True)
class SequencedOp:
    """An operation the ingress accepted for a model at one seq_id, answered through its future (`request_id`).
    Each kind is a subclass in its module of app.operations, which says how the Trainer runs it."""

    request_id: str


@dataclass(frozen=True)
class Skip(SequencedOp):
    """A seq_id whose request was rejected at the ingress (its future already failed); it only advances order."""


# ---- Trainer -> workers: commands every rank runs, in the order sent ----
# Each command's `name` is how logs and errors call it. `request_id`: the future a command serves, set on an
# operation's command when the Trainer dispatches it (a cancelled one is dropped while no rank has taken it; a death of
# the workers is charged to it); "" on one that serves no request. Each command's reply is named in its docstring.


class _Command:
    """What the sites that treat forward passes apart key on (`runs_a_pass`): the trainer ships a large batch by
    reference (app.trainer.shipping), blames a death of the workers on the passes first (app.trainer.worker_deaths)
    and puts several models' passes in one message (app.trainer.mixing); a rank runs those together and ends when one
    fails mid-pass (app.ranks.execute). A command class that does not declare it does not load."""

    forward_pass: ClassVar[bool]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "forward_pass" not in cls.__dict__ and not cls.__name__.startswith("_"):
            raise TypeError(f"command {cls.__name__} does not declare forward_pass")


class _ServesNoRequest(_Command):
    request_id: ClassVar[str] = ""


@dataclass(frozen=True)
class CreateModelCommand(_Command):
    """Add the model's adapter (and value head, for a critic) on the shared base. Reply: None."""

    forward_pass: ClassVar[bool] = False
    name: ClassVar[str] = "create_model"
    model_id: str
    spec: AdapterSpec
    request_id: str = ""


@dataclass(frozen=True)
class RemoveModelCommand(_ServesNoRequest):
    """Drop the model, if the rank has it. Reply: None."""

    forward_pass: ClassVar[bool] = False
    name: ClassVar[str] = "remove_model"
    model_id: str


@dataclass(frozen=True)
class PassMember:
    """One request of a pass that ran several models' forward(_backward)s together: its model's adapter and its
    datums' lengths, which is all its rows' share of the pass depends on."""

    spec: AdapterSpec
    lengths: np.ndarray


@dataclass(frozen=True)
class PassLayout:
    """The shape of a mixed pass (app.training.mixed_pass) and which of its members an operation was: what replays
    that operation bit for bit when its model is rebuilt, with stand-ins of the same shape for the other members."""

    members: tuple[PassMember, ...]
    own: int


@dataclass(frozen=True)
class ForwardBackwardCommand(_Command):
    """Run the rank's shard of the batch. Reply: a ShardOutput. Consecutive ones of distinct models in a message run
    as one pass where they can (app.ranks.execute). `replay`: rerun it as it ran in that mixed pass (a rebuild)."""

    forward_pass: ClassVar[bool] = True
    name: ClassVar[str] = "forward_backward"
    model_id: str
    args: ForwardBackwardArgs
    request_id: str = ""
    replay: PassLayout | None = None


@dataclass(frozen=True)
class OptimStepCommand(_Command):
    """Step the model's optimizer on its accumulated gradients. Reply: the step's metrics."""

    forward_pass: ClassVar[bool] = False
    name: ClassVar[str] = "optim_step"
    model_id: str
    params: OptimParams
    request_id: str = ""


# What a save writes: "adapter", the PEFT adapter (what samplers load); "state", adapter, value head, optimizer state
# and spec (what LoadStateCommand reads); "export", a download (a policy's adapter, or a critic's whole state).
SavedParts = Literal["adapter", "state", "export"]


@dataclass(frozen=True)
class SaveCommand(_Command):
    """Write the model's `what` at the storage `location` (rank 0 writes). Reply: the bytes written (0 on the other
    ranks)."""

    forward_pass: ClassVar[bool] = False
    model_id: str
    location: str
    what: SavedParts
    request_id: str = ""

    @property
    def name(self) -> str:
        return f"save_{self.what}"


@dataclass(frozen=True)
class LoadStateCommand(_Command):
    """Fill the model from the training state stored at `location`, its optimizer state too `with_optimizer`.
    Reply: None."""

    forward_pass: ClassVar[bool] = False
    name: ClassVar[str] = "load_state"
    model_id: str
    location: str
    with_optimizer: bool
    request_id: str = ""


@dataclass(frozen=True)
class SnapshotCommand(_ServesNoRequest):
    """Rank 0 copies the model's adapter and optimizer state and writes it to `location` on a thread. Reply: None."""

    forward_pass: ClassVar[bool] = False
    name: ClassVar[str] = "snapshot"
    model_id: str
    location: str


@dataclass(frozen=True)
class PingCommand(_ServesNoRequest):
    """Nothing to run (also what a cancelled or given-up command becomes). Reply: the rank's process id."""

    forward_pass: ClassVar[bool] = False
    name: ClassVar[str] = "ping"


# What an operation sends (app.operations); the Trainer sets its request_id.
OperationCommand = CreateModelCommand | ForwardBackwardCommand | OptimStepCommand | SaveCommand | LoadStateCommand
WorkerCommand = RemoveModelCommand | OperationCommand | SnapshotCommand | PingCommand


class PassCommand(Protocol):
    """What a command that runs a forward pass (`forward_pass`) has: the ranks run its batch (`args`) with the other
    models' passes of a message, and the trainer ships that batch by reference when it is large."""

    @property
    def model_id(self) -> str: ...

    @property
    def request_id(self) -> str: ...

    @property
    def args(self) -> ForwardBackwardArgs: ...


def runs_a_pass(command: WorkerCommand) -> TypeGuard[PassCommand]:
    """Whether `command` runs a forward pass over a batch: its class's declared `forward_pass`."""
    return command.forward_pass


@dataclass(frozen=True)
class ShardOutput:
    """A rank's answer to a ForwardBackwardCommand: its datum indices and their flat per-token outputs."""

    datum_indices: np.ndarray
    offsets: np.ndarray
    outputs: dict[str, np.ndarray]
    loss_sum: float
    stats: dict[str, tuple[float, float]] = field(default_factory=dict)  # the loss's metrics: name -> (sum, count)
    # a custom loss's estimated compute over the whole request, in tokens of the base's training (what it costs in
    # the fair share beyond the request's tokens)
    loss_cost_tokens: int = 0
    layout: PassLayout | None = None  # when it ran in a pass with other models' requests: that pass's shape


@dataclass(frozen=True)
class CommandError:
    """A command that raised on a rank; `error` is the failed-future body."""

    error: dict[str, Any]


# A rank's reply to one command: what its docstring names, or the error it raised.
RankReply = ShardOutput | dict[str, float] | int | None | CommandError
Replies = list[list[RankReply]]  # every rank's replies to a message's commands: replies[rank][command]
