"""The sampler's adapter cache (app/sampling/adapter_cache.py): an adapter is loaded once and served from memory,
and once its checkpoint's files are deleted it is evicted: refused on its next use, never served from the cache."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from app.errors import UserError
from app.sampling.adapter_cache import AdapterCache
from app.storage.objects import ObjectStorage


def _write(storage: ObjectStorage, location: str) -> None:
    def build(out: Path) -> None:
        out.mkdir(parents=True)
        (out / "adapter_model.safetensors").write_bytes(b"x")

    storage.write(location, build)


def test_a_deleted_adapter_is_evicted_not_served(tmp_path: Path) -> None:
    storage = ObjectStorage(str(tmp_path / "objects"))
    loads: list[str] = []

    async def load(directory: str) -> str:
        loads.append(directory)
        return f"lora-{len(loads)}"

    cache = AdapterCache("tiny", load, storage, tmp_path / "cache", max_cached=4, recheck_s=0)

    async def scenario() -> None:
        _write(storage, "run/weights/a")
        assert (await cache.get("run/weights/a")).lora == "lora-1"
        assert (await cache.get("run/weights/a")).lora == "lora-1"  # loaded once
        storage.delete("run/weights/a")
        with pytest.raises(UserError, match="no longer exist") as refused:
            await cache.get("run/weights/a")
        assert refused.value.field == "model_path"
        _write(storage, "run/weights/a")  # stored again: loaded anew, as the old one was evicted
        assert (await cache.get("run/weights/a")).lora == "lora-2"

    asyncio.run(scenario())
    assert len(loads) == 2


def test_at_most_max_cached_are_kept(tmp_path: Path) -> None:
    storage = ObjectStorage(str(tmp_path / "objects"))
    loads: list[str] = []

    async def load(directory: str) -> str:
        loads.append(directory)
        return directory

    cache = AdapterCache("tiny", load, storage, tmp_path / "cache", max_cached=2)

    async def scenario() -> None:
        for name in ("a", "b", "c", "a"):  # "a" was the least recently used when "c" came
            _write(storage, f"run/weights/{name}")
            await cache.get(f"run/weights/{name}")

    asyncio.run(scenario())
    assert [Path(d).name for d in loads] == ["a", "b", "c", "a"]
