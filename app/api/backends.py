"""What the API needs from the trainers and samplers (implemented over Serve handles in deployments.handles),
so routers stay free of Ray Serve."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncGenerator
from typing import Any

from app.messages import SequencedOp
from app.operations.create_model import CreateModel
from app.sampling.openai import Answer, Route
from app.sampling.params import SampleArgs


class TrainerClient(ABC):
    """Hands work to the trainer a model is routed to (by name, see BaseModelConfig.trainer_for); outcomes
    arrive through the future store (the trainer writes them; its reply hands them to this replica's `recent`)."""

    @abstractmethod
    def create_model(self, trainer: str, model_id: str, create: CreateModel, user: str) -> None:
        """Have the trainer create `user`'s model."""

    @abstractmethod
    def submit(self, trainer: str, model_id: str, seq_id: int, op: SequencedOp, user: str) -> None:
        """Queue `user`'s operation `op`: the trainer runs each model's in seq_id order, fairly across users."""

    @abstractmethod
    def unload_model(self, trainer: str, request_id: str, model_id: str) -> None: ...

    @abstractmethod
    async def cancel(self, trainer: str, model_id: str, seq_id: int, request_id: str) -> None:
        """Drop a cancelled operation that has not run yet; one already running finishes, unrecorded."""

    @abstractmethod
    async def missing(self, trainer: str, model_id: str, seq_ids: list[int]) -> list[int]:
        """Of these seq_ids of the model, those the trainer never received."""

    @abstractmethod
    async def ready(self) -> dict[str, bool]:
        """Whether each trainer answers."""

    @abstractmethod
    def in_flight(self) -> dict[str, int]:
        """Operations this ingress replica handed each trainer, queued or running there."""


class SamplerClient(ABC):
    """Hands sampling work to a base model's samplers, preferring replicas that hold the adapter."""

    @abstractmethod
    def admit(self, base_model: str, user: str, limit: int, share: int) -> bool:
        """Reserve room for one more of `user`'s samples in the pool of `limit` admitted or running here, fairly
        shared with `share` each (app.api.sample_slots.SampleSlots)."""

    @abstractmethod
    def release(self, base_model: str, user: str) -> None:
        """Give back an admission that will not be used."""

    @abstractmethod
    def held(self, base_model: str, user: str) -> int:
        """`user`'s samples admitted or running here."""

    @abstractmethod
    def sample(
        self, base_model: str, request_id: str, adapter_location: str | None, args: SampleArgs, user: str
    ) -> None:
        """Send `user`'s admitted sample; its admission lasts until the sampler finishes it."""

    @abstractmethod
    def openai(
        self, base_model: str, adapter_location: str | None, route: Route, body: dict[str, Any], user: str
    ) -> AsyncGenerator[Answer | str, None]:
        """`user`'s admitted OpenAI request to vLLM's serving layer: one (status, JSON body) answer, or a stream's
        SSE lines; its admission lasts until the iterator closes. Closing it early cancels the request."""

    @abstractmethod
    async def openai_models(self) -> list[dict[str, Any]]:
        """The model cards of every base model's samplers (OpenAI's /v1/models entries)."""

    @abstractmethod
    async def ready(self) -> dict[str, bool]:
        """Whether each base model's samplers answer."""

    @abstractmethod
    async def start_failures(self) -> dict[str, str]:
        """Why a base model's sampler could not start its engine, for each base model where one could not."""

    @abstractmethod
    def in_flight(self) -> dict[str, int]:
        """Samples this ingress replica admitted for each base model, waiting or running."""


class ReplicaCounts(ABC):
    """How many replicas each deployment of this application has (read from Serve in deployments.status)."""

    @abstractmethod
    async def replicas(self) -> dict[tuple[str, str], dict[str, int]]:
        """Replicas by state (e.g. `{"RUNNING": 2}`) of each trainer and sampler, by (`trainer` or `sampler`, its
        name: a trainer's, or the sampler's base model); {} when they cannot be read."""
