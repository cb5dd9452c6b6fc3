"""The sampler behind one base model: loads adapters by storage location, samples, and writes each future's
outcome."""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

from app.db.futures import PROTO_CONTENT_TYPE, FutureStore
from app.db.stability import StabilityRecord, StabilityStore, sequence_ids
from app.db.usage import UsageStore
from app.errors import ServerError, TinkerServeError
from app.metrics import server_metrics
from app.request_log import log_request, outcome_of
from app.sampling.adapter_cache import AdapterCache, LoadedAdapter
from app.sampling.engine import SamplerEngine
from app.sampling.openai import Answer, OpenAIServer, Route
from app.sampling.params import SampleArgs
from app.sampling.response import SampleResult, encode_sample_response
from app.storage.objects import ObjectStorage

logger = logging.getLogger("tinker_serve.sampler")

AdapterLoader = Callable[[str], Awaitable[LoadedAdapter]]


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
        self._adapters = AdapterCache(base_model, engine.load_adapter, storage, cache_dir, max_cached)
        self._openai: OpenAIServer = engine.openai_server(base_model)

    async def adapter(self, location: str) -> LoadedAdapter:
        """The adapter stored at `location`, while its files exist (app.sampling.adapter_cache)."""
        return await self._adapters.get(location)

    async def _registered(self, location: str, register: AdapterLoader | None) -> LoadedAdapter:
        """The adapter at `location`, `register` (Serve's multiplexing) told first. Asked of the cache even when
        Serve holds it, so an adapter whose files are gone is not served from Serve's own cache."""
        if register is not None:
            await register(location)
        return await self.adapter(location)

    async def openai_models(self) -> dict[str, Any]:
        return await self._openai.models()

    async def openai(
        self, route: Route, body: dict[str, Any], adapter_location: str | None, register: AdapterLoader
    ) -> Answer | AsyncIterator[str]:
        """An OpenAI request (checked by the ingress) through vLLM's serving layer, with the adapter stored at
        `adapter_location` (registered with Serve's multiplexing) or the base model's zero adapter."""
        started = time.monotonic()
        try:
            base = self._engine.base_adapter
            lora = (await self._registered(adapter_location, register)).lora if adapter_location else base
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
            adapter = await self._registered(adapter_location, register) if adapter_location else None
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
