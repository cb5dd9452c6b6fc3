"""Stability records through the SDK: a sampling client made with record_stability_info=True leaves one record per
sampled sequence, under its sequence_id, holding exactly the tokens and sampler logprobs the client received; the
session's limit refuses more, naming the field; clients without the flag record nothing."""

from __future__ import annotations

import asyncio
import sqlite3
from pathlib import Path

import numpy as np
import pytest
import tinker
from sqlalchemy.ext.asyncio import AsyncEngine
from tinker import types

from app.db.schema import connect
from app.db.stability import StabilityRecord, StabilityStore
from tests.integration.conftest import BASE_MODEL, MAX_STABILITY_RECORDS

PARAMS = types.SamplingParams(max_tokens=6, temperature=1.0, seed=3)


def _records(state_dir: Path, session_id: str, sequence_ids: list[str]) -> dict[str, StabilityRecord]:
    async def read() -> dict[str, StabilityRecord]:
        db: AsyncEngine = connect(f"sqlite+aiosqlite:///{state_dir / 'tinker_serve.db'}")
        try:
            return await StabilityStore(db).get(session_id, sequence_ids, len(sequence_ids))
        finally:
            await db.dispose()

    return asyncio.run(read())


@pytest.fixture
def recording_service(base_url: str) -> tinker.ServiceClient:
    client = tinker.ServiceClient(base_url=base_url, api_key="tml-stability-records")  # a session per test
    yield client
    client.close("success").result()


def test_records_hold_what_the_client_received(recording_service, state_dir: Path) -> None:
    sampler = recording_service.create_sampling_client(base_model=BASE_MODEL, record_stability_info=True).result()
    prompt = [1, 40, 41, 42]
    response = sampler.sample(types.ModelInput.from_ints(prompt), 4, PARAMS).result()
    ids = [s.sequence_id for s in response.sequences]
    assert len(set(ids)) == 4 and all(ids)
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        marks = ",".join("?" * len(ids))
        sessions = {
            row[0]
            for row in db.execute(f"SELECT session_id FROM stability_records WHERE sequence_id IN ({marks})", ids)
        }
    (session_id,) = sessions
    records = _records(state_dir, session_id, ids)
    assert sorted(records) == sorted(ids)
    for sequence in response.sequences:
        record = records[sequence.sequence_id]
        assert record.tokens.tolist() == sequence.tokens and record.prompt.tolist() == prompt
        np.testing.assert_array_equal(record.logprobs, np.asarray(sequence.logprobs, dtype=np.float32))
        assert record.adapter_location is None  # the base model sampled it
    assert _records(state_dir, "another-session", ids) == {}


def test_the_sessions_limit_refuses_more_records(recording_service) -> None:
    sampler = recording_service.create_sampling_client(base_model=BASE_MODEL, record_stability_info=True).result()
    prompt = types.ModelInput.from_ints([1, 50, 51])
    for start in range(0, MAX_STABILITY_RECORDS, 64):  # a new session: fill it up to the limit
        sampler.sample(prompt, min(64, MAX_STABILITY_RECORDS - start), PARAMS).result()
    with pytest.raises(tinker.BadRequestError) as info:
        sampler.sample(prompt, 1, PARAMS).result()
    assert "record_stability_info" in str(info.value) and "max_stability_records_per_session" in str(info.value)
    plain = recording_service.create_sampling_client(base_model=BASE_MODEL).result()  # no records: no limit
    assert len(plain.sample(prompt, 2, PARAMS).result().sequences) == 2


def test_samples_without_the_flag_leave_no_record(service_client, state_dir: Path) -> None:
    sampler = service_client.create_sampling_client(base_model=BASE_MODEL).result()
    response = sampler.sample(types.ModelInput.from_ints([1, 60, 61]), 2, PARAMS).result()
    ids = [s.sequence_id for s in response.sequences]
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        found = db.execute(
            f"SELECT count(*) FROM stability_records WHERE sequence_id IN ({','.join('?' * len(ids))})", ids
        )
        assert found.fetchone() == (0,)
