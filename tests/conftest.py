"""Shared test set-up: the repo root on sys.path, offline Hugging Face, the embedded tiny model path."""

from __future__ import annotations

import asyncio
import os
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("RAY_AUTH_MODE", "disabled")
os.environ.setdefault("TINKER_TELEMETRY", "0")
# Ray's own servers (GCS, raylets, object managers, agents) bind to 127.0.0.1 instead of this machine's address:
# Ray takes its node address from loopback when this is off, as on a laptop. Every test node is on this machine.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")

TINY_MODEL = ROOT / "models" / "tiny"

T = TypeVar("T")


def run_on_db(path: Path, body: Callable[..., Awaitable[T]]) -> T:
    """Run `body(db)` against a real SQLite file at `path` with every table created (the stores' unit tests)."""
    from app.db.schema import connect, create_tables

    async def main() -> T:
        db = connect("sqlite+aiosqlite:///" + str(path))
        await create_tables(db)
        try:
            return await body(db)
        finally:
            await db.dispose()

    return asyncio.run(main())
