"""The ingress's side of the Trainer and Sampler handles: calls that never block the request.

Trainers and samplers write each future's outcome themselves; when a call ends here, local long-polls
wake at once, and a call that failed outright fails its future so no client waits forever.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import Awaitable
from typing import Any, cast

from ray.exceptions import ActorUnavailableError, RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

from app.api.backends import SamplerClient, TrainerClient
from app.db.futures import FutureStore
from app.errors import ServerError, UserError
from app.messages import CreateModel, SequencedOp
from app.sampling.params import SampleArgs

logger = logging.getLogger("tinker_serve.ingress")


class HandleCalls:
    """Handles by name (a trainer, or a base model's samplers), and the calls in flight on them."""

    def __init__(self, role: str, handles: dict[str, DeploymentHandle], futures: FutureStore) -> None:
        self._role = role
        self.handles = handles
        self._futures = futures
        self._tasks: set[asyncio.Task] = set()
        self.in_flight: Counter[str] = Counter()

    def handle(self, name: str) -> DeploymentHandle:
        handle = self.handles.get(name)
        if handle is None:  # recorded under an earlier configuration
            raise UserError(
                f"{self._role} {name!r} is no longer served here; served: {sorted(self.handles)}", field="model_id"
            )
        return handle

    def track(self, name: str, request_id: str, response: DeploymentResponse | DeploymentResponseGenerator) -> None:
        self.in_flight[name] += 1
        # Ray types .remote() for streaming handles too; these handles never stream
        task = asyncio.create_task(self._settle(name, request_id, cast(DeploymentResponse, response)))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, name: str, request_id: str, response: Awaitable[Any]) -> None:
        try:
            await response
        except Exception as exc:
            if self._role == "trainer" and isinstance(exc, RayActorError | ActorUnavailableError):
                # its next replica rebuilds the models and reruns this from the journal (app.db.journal)
                logger.warning(
                    "trainer %s went away while %s was queued (%r); its next replica reruns it", name, request_id, exc
                )
            else:  # the replica died or refused; the future must not hang
                logger.exception("%s call for %s failed", self._role, request_id)
                error = ServerError(f"{self._role} call failed: {exc!r}")
                await self._futures.fail_if_pending(request_id, error.to_body())
        finally:
            self.in_flight[name] -= 1
        self._futures.notify(request_id)

    async def ready(self) -> dict[str, bool]:
        async def ping(handle: DeploymentHandle) -> bool:
            try:
                return await asyncio.wait_for(handle.ping.remote(), 5)
            except Exception:  # noqa: BLE001 - not ready is the answer
                return False

        names = list(self.handles)
        return dict(zip(names, await asyncio.gather(*(ping(self.handles[n]) for n in names))))


class ServeTrainerClient(TrainerClient):
    def __init__(self, handles: dict[str, DeploymentHandle], futures: FutureStore) -> None:
        self._calls = HandleCalls("trainer", handles, futures)

    def create_model(self, trainer: str, model_id: str, create: CreateModel) -> None:
        self._calls.track(trainer, create.request_id, self._calls.handle(trainer).create_model.remote(model_id, create))

    def submit(self, trainer: str, model_id: str, seq_id: int, op: SequencedOp, user: str) -> None:
        handle = self._calls.handle(trainer)
        self._calls.track(trainer, op.request_id, handle.submit.remote(model_id, seq_id, op, user))

    def unload_model(self, trainer: str, request_id: str, model_id: str) -> None:
        self._calls.track(trainer, request_id, self._calls.handle(trainer).unload_model.remote(request_id, model_id))

    async def cancel(self, trainer: str, model_id: str, seq_id: int, request_id: str) -> None:
        await self._calls.handle(trainer).cancel.remote(model_id, seq_id, request_id)

    async def ready(self) -> dict[str, bool]:
        return await self._calls.ready()


class ServeSamplerClient(SamplerClient):
    """Requests for one adapter go, where possible, to replicas that already hold it (Serve multiplexing)."""

    def __init__(self, handles: dict[str, DeploymentHandle], futures: FutureStore) -> None:
        self._calls = HandleCalls("sampler", handles, futures)
        self._admitted: Counter[str] = Counter()  # admitted, not yet sent (their future is being created)

    def admit(self, base_model: str, limit: int) -> bool:
        if self._admitted[base_model] + self._calls.in_flight[base_model] >= limit:
            return False
        self._admitted[base_model] += 1
        return True

    def release(self, base_model: str) -> None:
        self._admitted[base_model] -= 1

    def sample(self, base_model: str, request_id: str, adapter_location: str | None, args: SampleArgs) -> None:
        self._admitted[base_model] -= 1  # from here on it counts as in flight
        handle = self._calls.handle(base_model)
        if adapter_location:
            handle = handle.options(multiplexed_model_id=adapter_location)
        self._calls.track(base_model, request_id, handle.sample.remote(request_id, args))

    async def ready(self) -> dict[str, bool]:
        return await self._calls.ready()
