"""Background sweeps (expired samplers, silent sessions, expired checkpoints, ...): one loop shape for all, declared
as a table of `Sweep`s whose periods follow config fields, started and stopped together."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from functools import partial
from typing import Generic, TypeVar

from app.config import ServerConfig

logger = logging.getLogger("tinker_serve.sweeps")

T = TypeVar("T")


@dataclass(frozen=True)
class Period:
    """Seconds from the config: the value of `field` (`section.name`) divided by `divided_by`, at most `cap_s`;
    with no field, `cap_s` itself."""

    field: str | None = None
    divided_by: float = 1.0
    cap_s: float = math.inf

    def seconds(self, config: ServerConfig) -> float:
        if self.field is None:
            return self.cap_s
        section, name = self.field.split(".")
        return min(self.cap_s, float(getattr(getattr(config, section), name)) / self.divided_by)


@dataclass(frozen=True)
class Sweep(Generic[T]):
    """`run(target)` every `every` (the first after `first_after`, default one period); it returns how many things
    it swept."""

    what: str  # for the logs: "swept 3 {what}"
    every: Period
    run: Callable[[T], Awaitable[int]]
    first_after: Period | None = None


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


def start_sweeps(table: Iterable[Sweep[T]], target: T, config: ServerConfig) -> list[asyncio.Task[None]]:
    """Start every sweep of `table` over `target` on the running loop, periods read from `config`."""
    return [
        asyncio.create_task(
            sweep_forever(
                sweep.what,
                partial(sweep.run, target),
                sweep.every.seconds(config),
                None if sweep.first_after is None else sweep.first_after.seconds(config),
            )
        )
        for sweep in table
    ]


async def stop_sweeps(tasks: list[asyncio.Task[None]]) -> None:
    """Cancel the sweeps and wait until they have ended (a sweep mid-round stops at its next await)."""
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
