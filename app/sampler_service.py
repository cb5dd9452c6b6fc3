"""The sampler behind one base model: loads adapters by directory, samples, and writes each future's outcome."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from app.errors import ServerError, TinkerServeError, UserError
from app.sampling.engine import SamplerEngine
from app.sampling.params import SampleArgs
from app.sampling.response import encode_sample_response
from app.store.futures import PROTO_CONTENT_TYPE, FutureStore

logger = logging.getLogger("tinker_serve.sampler")

AdapterLoader = Callable[[str], Awaitable["LoadedAdapter"]]


@dataclass(frozen=True)
class LoadedAdapter:
    directory: str
    lora: Any  # the engine's handle (a vLLM LoRARequest)
    version: int  # mtime of the weights file when loaded


def _version(directory: str) -> int:
    try:
        return os.stat(os.path.join(directory, "adapter_model.safetensors")).st_mtime_ns
    except FileNotFoundError:
        raise UserError(f"sampler weights at {directory} no longer exist (deleted or expired)",
                        field="model_path") from None


class SamplerService:
    def __init__(self, engine: SamplerEngine, futures: FutureStore) -> None:
        self._engine = engine
        self._futures = futures
        self._adapters: dict[str, LoadedAdapter] = {}

    async def adapter(self, directory: str) -> LoadedAdapter:
        """The adapter at `directory`, loaded again (under a new id) if its files changed since."""
        version = _version(directory)
        loaded = self._adapters.get(directory)
        if loaded is None or loaded.version != version:
            loaded = LoadedAdapter(directory, await self._engine.load_adapter(directory), version)
            self._adapters[directory] = loaded
        return loaded

    async def sample(self, request_id: str, args: SampleArgs, adapter_dir: str | None,
                     register: AdapterLoader | None = None) -> None:
        """Sample and write the outcome. `register` (Serve's multiplexing) is told first which adapter is used."""
        try:
            if adapter_dir and register is not None:
                await register(adapter_dir)
            adapter = await self.adapter(adapter_dir) if adapter_dir else None
            result = await self._engine.sample(args, adapter.lora if adapter else None)
            payload = encode_sample_response(result, topk_prompt=args.topk_prompt_logprobs,
                                             topk_sample=args.topk_sample_logprobs)
        except TinkerServeError as exc:
            await self._futures.fail(request_id, exc.to_body())
            return
        except Exception as exc:  # noqa: BLE001 - the engine failed; the client must learn it, not hang
            logger.exception("sampling %s failed", request_id)
            await self._futures.fail(request_id, ServerError(f"sampling failed: {exc!r}").to_body())
            return
        await self._futures.complete(request_id, payload, PROTO_CONTENT_TYPE)
