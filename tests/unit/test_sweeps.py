"""app.sweeps: a table of sweeps starts on the running loop with periods read from the config, a failed round is
logged and retried, and stopping cancels every sweep."""

from __future__ import annotations

import asyncio
import logging

import pytest

from app.config import ServerConfig
from app.sweeps import Period, Sweep, start_sweeps, stop_sweeps


def _config(**timeouts: float) -> ServerConfig:
    return ServerConfig(base_models=[{"name": "tiny", "path": "models/tiny"}], timeouts=timeouts)


def test_a_period_is_its_field_divided_and_capped_or_a_fixed_cap() -> None:
    config = _config(session_timeout_seconds=40.0)
    assert Period("timeouts.session_timeout_seconds").seconds(config) == 40.0
    assert Period("timeouts.session_timeout_seconds", divided_by=4).seconds(config) == 10.0
    assert Period("timeouts.session_timeout_seconds", divided_by=4, cap_s=8.0).seconds(config) == 8.0
    assert Period(cap_s=60.0).seconds(config) == 60.0


def test_started_sweeps_survive_a_failed_round_and_stop(caplog: pytest.LogCaptureFixture) -> None:
    rounds: list[int] = []

    async def main() -> list[bool]:
        second = asyncio.Event()

        async def flaky(seen: list[int]) -> int:
            seen.append(len(seen))
            if len(seen) == 1:
                raise RuntimeError("the first round fails")
            second.set()
            return 1

        table = [Sweep("test rounds", Period("timeouts.handover_check_seconds"), flaky, first_after=Period(cap_s=0))]
        tasks = start_sweeps(table, rounds, _config(handover_check_seconds=0.001))
        await asyncio.wait_for(second.wait(), 30)
        await asyncio.wait_for(stop_sweeps(tasks), 30)
        return [task.cancelled() for task in tasks]  # here, before asyncio.run would cancel what is left

    with caplog.at_level(logging.INFO, logger="tinker_serve.sweeps"):
        stopped = asyncio.run(main())
    assert rounds[:2] == [0, 1]
    assert stopped == [True]
    assert "sweeping test rounds failed" in caplog.text
    assert "swept 1 test rounds" in caplog.text
