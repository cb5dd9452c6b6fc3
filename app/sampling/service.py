"""The sampler behind one base model: loads adapters by storage location, samples, and writes each future's
outcome."""

from __future__ import annotations

import asyncio
import logging
import shutil
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from app.db.futures import PROTO_CONTENT_TYPE, FutureStore
from app.db.stability import StabilityRecord, StabilityStore, sequence_ids
from app.db.usage import UsageStore
from app.errors import ServerError, TinkerServeError, UserError
from app.metrics import server_metrics
from app.request_log import log_request, outcome_of
from app.sampling.engine import SamplerEngine
from app.sampling.openai import Answer, OpenAIServer, Route
from app.sampling.params import SampleArgs
from app.sampling.response import SampleResult, encode_sample_response
from app.storage.objects import ObjectStorage

logger = logging.getLogger("tinker_serve.sampler")

AdapterLoader = Callable[[str], Awaitable["LoadedAdapter"]]


@dataclass(frozen=True)
class LoadedAdapter:
    location: str
    directory: Path  # local files (a download, for object storage)
    lora: Any  # the engine's handle (a vLLM LoRARequest)


class SamplerService:
    def __init__(
        self,
        base_model: str,
        engine: SamplerEngine,
        futures: FutureStore,
        stability: StabilityStore,
        usage: UsageStore,
        storage: ObjectStorage,
        cache_dir: Path,
        max_cached: int,
    ) -> None:
        self._base_model = base_model
        self._engine = engine
        self._futures = futures
        self._stability = stability
        self._usage = usage
        self._storage = storage
        self._cache_dir = cache_dir
        self._max_cached = max_cached
        self._adapters: OrderedDict[str, LoadedAdapter] = OrderedDict()
        self._openai: OpenAIServer = engine.openai_server(base_model)

    async def adapter(self, location: str) -> LoadedAdapter:
        """The adapter stored at `location` (locations never change, so one load serves for good). Downloads
        from object storage are kept for the `max_cached` most recently used adapters."""
        loaded = self._adapters.get(location)
        if loaded is not None:
            self._adapters.move_to_end(location)
            return loaded
        try:
            directory = await asyncio.to_thread(self._storage.fetch, location, self._cache_dir)
        except FileNotFoundError:
            raise UserError("these sampler weights no longer exist (deleted or expired)", field="model_path") from None
        loaded = LoadedAdapter(location, directory, await self._engine.load_adapter(str(directory)))
        server_metrics().adapter_loads.inc(tags={"base_model": self._base_model})
        self._adapters[location] = loaded
        while len(self._adapters) > self._max_cached:
            _, evicted = self._adapters.popitem(last=False)
            if not self._storage.is_local:  # vLLM reads the files again if it evicts the adapter itself
                await asyncio.to_thread(shutil.rmtree, evicted.directory, ignore_errors=True)
        return loaded

    async def openai_models(self) -> dict[str, Any]:
        return await self._openai.models()

    async def openai(
        self, route: Route, body: dict[str, Any], adapter_location: str | None, register: AdapterLoader
    ) -> Answer | AsyncIterator[str]:
        """An OpenAI request (checked by the ingress) through vLLM's serving layer, with the adapter stored at
        `adapter_location` (registered with Serve's multiplexing) or the base model's zero adapter."""
        started = time.monotonic()
        try:
            lora = (await register(adapter_location)).lora if adapter_location else self._engine.base_adapter
        except TinkerServeError as exc:
            return exc.status_code, exc.to_openai_body()
        answer = await self._openai.respond(route, body, lora)
        log_request(
            "ran",
            op=f"openai_{route}",
            base_model=self._base_model,
            adapter=adapter_location,
            status=answer[0] if isinstance(answer, tuple) else "streaming",
            seconds=round(time.monotonic() - started, 4),
        )
        return answer

    async def sample(
        self, request_id: str, args: SampleArgs, adapter_location: str | None, register: AdapterLoader | None = None
    ) -> None:
        """Sample and write the outcome. `register` (Serve's multiplexing) is told first which adapter is used."""
        started = time.monotonic()
        tokens, error = await self._sample(request_id, args, adapter_location, register)
        if error is None and args.usage_session is not None:
            counts = {"sampling_prefill": len(args.prompt), "sampling_sample": tokens}
            await self._usage.record(args.usage_session, self._base_model, counts)
        log_request(
            "ran",
            op="sample",
            base_model=self._base_model,
            adapter=adapter_location,
            tinker_request_id=request_id,
            outcome=outcome_of(error),
            tokens=tokens,
            seconds=round(time.monotonic() - started, 4),
        )

    async def _sample(
        self, request_id: str, args: SampleArgs, adapter_location: str | None, register: AdapterLoader | None
    ) -> tuple[int, dict | None]:
        """(tokens sampled, None) once the future is complete, or (0, the error its future failed with)."""
        try:
            if adapter_location and register is not None:
                await register(adapter_location)
            adapter = await self.adapter(adapter_location) if adapter_location else None
            result = await self._engine.sample(args, adapter.lora if adapter else None)
            tokens = sum(len(s.tokens) for s in result.sequences)
            server_metrics().tokens.inc(tokens, tags={"name": self._base_model, "kind": "sampled"})
            payload = encode_sample_response(
                result, topk_prompt=args.topk_prompt_logprobs, topk_sample=args.topk_sample_logprobs
            )
            if args.record_for_session is not None:  # stored before the future completes: a client may use it next
                await self._stability.add(_stability_records(request_id, args, adapter_location, result))
        except TinkerServeError as exc:
            error = exc.to_body()
        except Exception as exc:  # the engine failed; the client must learn it, not hang
            logger.exception("sampling %s failed", request_id)
            error = ServerError(f"sampling failed: {exc!r}").to_body()
        else:
            await self._futures.complete(request_id, payload, PROTO_CONTENT_TYPE)
            return tokens, None
        await self._futures.fail(request_id, error)
        return 0, error


def _stability_records(
    request_id: str, args: SampleArgs, adapter_location: str | None, result: SampleResult
) -> list[StabilityRecord]:
    assert args.record_for_session is not None
    prompt = np.asarray(args.prompt, dtype=np.int32)
    return [
        StabilityRecord(
            sequence_id=sequence_id,
            session_id=args.record_for_session,
            adapter_location=adapter_location,
            prompt=prompt,
            tokens=np.asarray(sequence.tokens, dtype=np.int32),
            logprobs=np.asarray(sequence.logprobs, dtype=np.float32),
        )
        for sequence_id, sequence in zip(sequence_ids(request_id, len(result.sequences)), result.sequences)
    ]
