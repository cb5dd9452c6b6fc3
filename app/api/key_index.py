"""Which keys exist, per replica, as the SHA-256 of each: lets the gate answer a flood of made-up keys from a client
past its refused-key budget without a key-store lookup each, and still never refuse a key that exists. A key not
in the index waits for a read of the key store that began after it was asked about: one read a second at most,
shared by every such request, however many there are (a key issued a moment ago is found by it)."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from app.db.keys import KeyStore, key_hash

REFRESH_S = 1.0  # the least time between two reads of every key's hash


@dataclass
class KeyIndex:
    keys: KeyStore
    configured: frozenset[str]  # keys the operator configured: they exist before their first use enrolls them
    _hashes: set[str] = field(default_factory=set)
    _read_started: float = float("-inf")  # monotonic time when the last read of the key store began
    _reading: asyncio.Future[None] | None = None

    def __post_init__(self) -> None:
        self._configured = {key_hash(k) for k in self.configured}

    async def exists(self, secret: str) -> bool:
        """Whether `secret` is a key of the key store or a configured one (revoked and expired keys included)."""
        digest = key_hash(secret)
        if digest in self._hashes or digest in self._configured:
            return True
        asked = time.monotonic()
        while self._read_started < asked:  # until a read that began after the question has ended
            if self._reading is None or self._reading.done():
                self._reading = asyncio.ensure_future(self._read(self._read_started + REFRESH_S - time.monotonic()))
            await asyncio.shield(self._reading)
        return digest in self._hashes

    async def _read(self, delay: float) -> None:
        await asyncio.sleep(max(0.0, delay))
        started = time.monotonic()
        self._hashes = await self.keys.hashes()
        self._read_started = started
