"""The ingress's side of the Trainer and Sampler handles: calls that never block the request.

Trainers and samplers write each future's outcome to the database themselves, then return it in their reply.
When a call ends here, the outcome it returned is kept in memory with the user whose request made the future
(`FutureStore.recent`), and local long-polls wake at once and answer from it without reading the row; a call that
failed outright fails its future so no client waits forever. A sample whose replica died is sent again (Serve
routes it to a live or replacement replica) while its future is pending.
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncGenerator, Callable
from typing import Any, cast

from ray.exceptions import RayActorError
from ray.serve.handle import DeploymentHandle, DeploymentResponse, DeploymentResponseGenerator

from app.api.backends import SamplerClient, TrainerClient
from app.api.sample_slots import SampleSlots
from app.db.futures import FutureStore, Pending
from app.db.outcomes import Completed, Failed
from app.errors import ServerError, UserError
from app.messages import SequencedOp
from app.operations.create_model import CreateModel
from app.retry import NO_RETRIES, RetryPolicy, call_with_retries
from app.sampling.openai import Answer, Route
from app.sampling.params import SampleArgs

logger = logging.getLogger("tinker_serve.ingress")

REPLICA_GONE = (RayActorError,)  # ActorDiedError, ActorUnavailableError: the replica died or cannot be reached
HandleCall = Callable[[], DeploymentResponse | DeploymentResponseGenerator]


async def _answer(call: HandleCall) -> Any:
    """Make the call and await it; cancelled (the retry deadline passed), cancel the request too."""
    response = cast(DeploymentResponse, call())  # Ray types .remote() for streaming handles too; these never stream
    try:
        return await response
    except asyncio.CancelledError:
        response.cancel()
        raise


class HandleCalls:
    """Handles by name (a trainer, or a base model's samplers), and the calls in flight on them."""

    def __init__(
        self,
        role: str,
        handles: dict[str, DeploymentHandle],
        futures: FutureStore,
        retry: RetryPolicy = NO_RETRIES,
        *,
        next_replica_reruns: bool = False,
    ) -> None:
        """`next_replica_reruns`: a replica that dies leaves the future pending (its successor reruns the call)."""
        self._role = role
        self._next_replica_reruns = next_replica_reruns
        self.handles = handles
        self._futures = futures
        self._retry = retry
        self._tasks: set[asyncio.Task] = set()
        self.in_flight: Counter[str] = Counter()

    def handle(self, name: str) -> DeploymentHandle:
        handle = self.handles.get(name)
        if handle is None:  # recorded under an earlier configuration
            raise UserError(
                f"{self._role} {name!r} is no longer served here; served: {sorted(self.handles)}", field="model_id"
            )
        return handle

    def track(self, name: str, request_id: str, call: HandleCall, owner: str | None = None) -> asyncio.Task[None]:
        """Make `call` (again, if its replica dies and the retry policy allows) until it answers. `owner`: the user
        whose request made the future, kept with the outcome the call returns. Returns the task that settles it."""
        self.in_flight[name] += 1
        task = asyncio.create_task(self._settle(name, request_id, call, owner))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _settle(self, name: str, request_id: str, call: HandleCall, owner: str | None) -> None:
        async def pending() -> bool:  # the dead replica may have written the outcome first
            return isinstance(await self._futures.get(request_id), Pending)

        try:
            written = await call_with_retries(
                lambda: _answer(call),
                retry_on=REPLICA_GONE,
                policy=self._retry,
                label=f"{self._role} call for {request_id}",
                worth_retrying=pending,
            )
            # what the replica wrote (committed, final): the long-poll answers from it, before it is woken below
            if isinstance(written, Completed | Failed) and written.request_id == request_id:
                self._futures.recent.put(written, owner)
        except Exception as exc:
            if self._next_replica_reruns and isinstance(exc, REPLICA_GONE):
                logger.warning(
                    "%s %s went away while %s was queued (%r); its next replica reruns it",
                    self._role,
                    name,
                    request_id,
                    exc,
                )
            else:  # the replica died or refused, or the retries ran out; the future must not hang
                logger.exception("%s call for %s failed", self._role, request_id)
                error = ServerError(f"{self._role} call failed: {exc!r}")
                await self._futures.fail_if_pending(request_id, error.to_body())
        finally:
            self.in_flight[name] -= 1
        self._futures.notify(request_id)

    async def ask_each(self, method: str, unanswered: Any) -> dict[str, Any]:
        """Each handle's answer to `method` (no arguments) within 5 s, or `unanswered` where it gives none."""

        async def ask(handle: DeploymentHandle) -> Any:
            try:
                return await asyncio.wait_for(getattr(handle, method).remote(), 5)
            except Exception:  # noqa: BLE001 - no answer (starting, gone, or refusing) is the answer
                return unanswered

        names = list(self.handles)
        return dict(zip(names, await asyncio.gather(*(ask(self.handles[n]) for n in names))))

    async def ready(self) -> dict[str, bool]:
        return await self.ask_each("ping", False)


class ServeTrainerClient(TrainerClient):
    def __init__(self, handles: dict[str, DeploymentHandle], futures: FutureStore) -> None:
        # a trainer's next replica rebuilds its models and reruns what was queued from the journal (app.db.journal)
        self._calls = HandleCalls("trainer", handles, futures, next_replica_reruns=True)

    def create_model(self, trainer: str, model_id: str, create: CreateModel, user: str) -> None:
        handle = self._calls.handle(trainer)
        self._calls.track(trainer, create.request_id, lambda: handle.create_model.remote(model_id, create), user)

    def submit(self, trainer: str, model_id: str, seq_id: int, op: SequencedOp, user: str) -> None:
        handle = self._calls.handle(trainer)
        self._calls.track(trainer, op.request_id, lambda: handle.submit.remote(model_id, seq_id, op, user), user)

    def unload_model(self, trainer: str, request_id: str, model_id: str) -> None:
        handle = self._calls.handle(trainer)
        self._calls.track(trainer, request_id, lambda: handle.unload_model.remote(request_id, model_id))

    async def cancel(self, trainer: str, model_id: str, seq_id: int, request_id: str) -> None:
        await self._calls.handle(trainer).cancel.remote(model_id, seq_id, request_id)

    async def missing(self, trainer: str, model_id: str, seq_ids: list[int]) -> list[int]:
        missing: list[int] = await self._calls.handle(trainer).missing.remote(model_id, seq_ids)
        return missing

    async def ready(self) -> dict[str, bool]:
        return await self._calls.ready()

    def in_flight(self) -> dict[str, int]:
        return {name: self._calls.in_flight[name] for name in self._calls.handles}


class ServeSamplerClient(SamplerClient):
    """Requests for one adapter go, where possible, to replicas that already hold it (Serve multiplexing)."""

    def __init__(self, handles: dict[str, DeploymentHandle], futures: FutureStore, retry: RetryPolicy) -> None:
        self._calls = HandleCalls("sampler", handles, futures, retry)
        self._slots = SampleSlots()  # admitted samples, sent or not, until they are answered

    def admit(self, base_model: str, user: str, limit: int, share: int) -> bool:
        return self._slots.admit(base_model, user, limit, share)

    def release(self, base_model: str, user: str) -> None:
        self._slots.release(base_model, user)

    def held(self, base_model: str, user: str) -> int:
        return self._slots.held(base_model, user)

    def sample(
        self, base_model: str, request_id: str, adapter_location: str | None, args: SampleArgs, user: str
    ) -> None:
        try:
            handle = self._calls.handle(base_model)
        except UserError:
            self._slots.release(base_model, user)
            raise
        if adapter_location:
            handle = handle.options(multiplexed_model_id=adapter_location)
        task = self._calls.track(base_model, request_id, lambda: handle.sample.remote(request_id, args), user)
        task.add_done_callback(lambda _: self._slots.release(base_model, user))

    async def openai(
        self, base_model: str, adapter_location: str | None, route: Route, body: dict[str, Any], user: str
    ) -> AsyncGenerator[Answer | str, None]:
        self._calls.in_flight[base_model] += 1
        try:
            handle = self._calls.handle(base_model).options(stream=True, multiplexed_model_id=adapter_location or "")
            response = cast(DeploymentResponseGenerator, handle.openai.remote(route, body))
            try:
                async for item in response:
                    yield item
            finally:  # done, or the client went away: stop the replica's work too
                response.cancel()
        finally:
            self._calls.in_flight[base_model] -= 1
            self._slots.release(base_model, user)

    async def openai_models(self) -> list[dict[str, Any]]:
        handles = self._calls.handles.values()
        lists = await asyncio.gather(*(handle.openai_models.remote() for handle in handles))
        return [card for models in lists for card in models["data"]]

    async def ready(self) -> dict[str, bool]:
        return await self._calls.ready()

    async def start_failures(self) -> dict[str, str]:
        reasons = await self._calls.ask_each("start_failure", None)  # None: started, still starting, or gone
        return {name: reason for name, reason in reasons.items() if reason}

    def in_flight(self) -> dict[str, int]:
        return {name: self._slots.held(name) for name in self._calls.handles}
