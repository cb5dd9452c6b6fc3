"""The training tests' rank groups (sharded_ranks.run_ranks) live for the session and stop at its end."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.unit.training.sharded_ranks import close_groups


@pytest.fixture(scope="session", autouse=True)
def rank_groups() -> Iterator[None]:
    yield
    close_groups()
