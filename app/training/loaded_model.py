"""One trained model as a rank holds it (app.training.engine keeps them; a mixed pass runs several)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from app.messages import AdapterSpec


@dataclass
class LoadedModel:
    """One trained model on this rank: its adapter's module name, trainable parameters and optimizer."""

    name: str  # module keys cannot hold every model id
    spec: AdapterSpec
    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer  # AdamW or Dimuon, as spec.optimizer says
    value_head: torch.nn.Linear | None  # critics only
