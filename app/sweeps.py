"""Background sweeps (expired samplers, silent sessions, expired checkpoints): one loop shape for all."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable

logger = logging.getLogger("tinker_serve.sweeps")


async def sweep_forever(
    what: str, sweep: Callable[[], Awaitable[int]], interval_s: float, first_delay_s: float | None = None
) -> None:
    """Run `sweep` every `interval_s` (first after `first_delay_s`, default one interval) until cancelled; a
    failed sweep is logged and retried on the next round."""
    await asyncio.sleep(interval_s if first_delay_s is None else first_delay_s)
    while True:
        try:
            done = await sweep()
            if done:
                logger.info("swept %d %s", done, what)
        except Exception:  # the next sweep retries
            logger.exception("sweeping %s failed", what)
        await asyncio.sleep(interval_s)
