"""The adapters a sampler has loaded, by storage location: the `max_cached` most recently used, each served only
while its files still exist. A checkpoint deleted (or an ephemeral adapter expired) is evicted on its next use, its
download removed with it: a location's files never change, but they can go."""

from __future__ import annotations

import asyncio
import shutil
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from app.errors import UserError
from app.metrics import server_metrics
from app.storage.objects import ObjectStorage

RECHECK_S = 5.0  # how stale a cached adapter's "its files exist" may be: one storage listing per adapter this often


@dataclass(frozen=True)
class LoadedAdapter:
    location: str
    directory: Path  # local files (a download, for object storage)
    lora: Any  # the engine's handle (a vLLM LoRARequest)


def _gone() -> UserError:
    return UserError("these sampler weights no longer exist (deleted or expired)", field="model_path")


class AdapterCache:
    def __init__(
        self,
        base_model: str,
        load: Callable[[str], Awaitable[Any]],
        storage: ObjectStorage,
        cache_dir: Path,
        max_cached: int,
        recheck_s: float = RECHECK_S,
    ) -> None:
        """`load`: the engine's, from a local adapter directory to its handle."""
        self._base_model = base_model
        self._load = load
        self._storage = storage
        self._cache_dir = cache_dir
        self._max_cached = max_cached
        self._recheck_s = recheck_s
        self._adapters: OrderedDict[str, tuple[LoadedAdapter, float]] = OrderedDict()  # and when its files were seen

    async def get(self, location: str) -> LoadedAdapter:
        """The adapter stored at `location`, loaded once; a user error naming model_path once its files are gone."""
        cached = self._adapters.get(location)
        if cached is not None:
            loaded, seen = cached
            if time.monotonic() - seen < self._recheck_s:
                self._adapters.move_to_end(location)
                return loaded
            try:
                await asyncio.to_thread(self._storage.files, location)
            except FileNotFoundError:
                await self._evict(location)
                raise _gone() from None
            self._adapters[location] = (loaded, time.monotonic())
            self._adapters.move_to_end(location)
            return loaded
        try:
            directory = await asyncio.to_thread(self._storage.fetch, location, self._cache_dir)
        except FileNotFoundError:
            raise _gone() from None
        loaded = LoadedAdapter(location, directory, await self._load(str(directory)))
        server_metrics().adapter_loads.inc(tags={"base_model": self._base_model})
        self._adapters[location] = (loaded, time.monotonic())
        while len(self._adapters) > self._max_cached:
            await self._evict(next(iter(self._adapters)))
        return loaded

    async def _evict(self, location: str) -> None:
        cached = self._adapters.pop(location, None)
        # a download of ours (vLLM reads the files again if it evicts the adapter itself)
        if cached is not None and not self._storage.is_local:
            await asyncio.to_thread(shutil.rmtree, cached[0].directory, ignore_errors=True)
