"""Collaborators of the routers, reached through one `Services` object held on the app."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated

from fastapi import Depends, Request

from app.api.dispatch import TrainerDispatcher
from app.config import ServerConfig
from app.store.futures import FutureStore
from app.store.metadata import MetadataStore, TrainingRun
from app.training.validation import ModelLimits


@dataclass
class Services:
    config: ServerConfig
    futures: FutureStore
    metadata: MetadataStore
    trainers: TrainerDispatcher
    model_limits: dict[str, ModelLimits]  # by base model name
    api_keys: frozenset[str]
    _runs: dict[str, TrainingRun] = field(default_factory=dict)

    @property
    def checkpoint_root(self) -> Path:
        return Path(self.config.state_dir) / "checkpoints"

    async def training_run(self, model_id: str) -> TrainingRun:
        """The run behind a model id (cached; runs never change base model)."""
        run = self._runs.get(model_id)
        if run is None:
            run = await self.metadata.get_training_run(model_id)
            self._runs[model_id] = run
        return run


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]
