"""Sessions end two ways, and either way their models are unloaded from the trainers (checkpoints stay):
finish (ServiceClient.close) and silence past timeouts.session_timeout_seconds."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import tinker

from tests.integration.conftest import BASE_MODEL, SESSION_TIMEOUT_S
from tests.integration.helpers import new_client, raw_session_with_model

HEADERS = {"X-API-Key": "tml-integration-tests"}


def _state(db_path: Path, session: str, model_id: str) -> tuple[str | None, int, str | None]:
    """(the session's finished reason, whether its model is unloaded, the unload future's state)."""
    with sqlite3.connect(db_path) as db:
        reason = db.execute("SELECT finished_reason FROM sessions WHERE session_id = ?", (session,)).fetchone()[0]
        unloaded = db.execute("SELECT unloaded FROM training_runs WHERE model_id = ?", (model_id,)).fetchone()[0]
        unload = db.execute(
            "SELECT state FROM futures WHERE kind = 'unload_model' AND subject_id = ?", (model_id,)
        ).fetchone()
    return reason, unloaded, unload[0] if unload else None


def _silent_for(db_path: Path, session: str, model_id: str) -> float:
    """Seconds from the session's last heartbeat to its model's unload (what its expiry started)."""
    with sqlite3.connect(db_path) as db:
        (beat,) = db.execute("SELECT last_heartbeat FROM sessions WHERE session_id = ?", (session,)).fetchone()
        (unload,) = db.execute(
            "SELECT created_at FROM futures WHERE kind = 'unload_model' AND subject_id = ?", (model_id,)
        ).fetchone()
    return unload - beat


def _wait_for(db_path: Path, session: str, model_id: str, expected: tuple, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while (state := _state(db_path, session, model_id)) != expected:
        assert time.monotonic() < deadline, state
        time.sleep(1)


def test_finish_and_silence_unload_models(
    base_url: str, state_dir: Path, service_client: tinker.ServiceClient, silent_session: tuple[str, str]
) -> None:
    """The silent session (conftest's `silent_session`) was made as the shared app came up, its timeout running out
    while the suite went on."""
    db_path = state_dir / "tinker_serve.db"
    sdk_model = new_client(service_client, seed=61).model_id
    sdk_session = sdk_model.split(":train:")[0]
    with httpx.Client(base_url=base_url, timeout=60, headers=HEADERS) as http:
        finished, finished_model = raw_session_with_model(http, BASE_MODEL)
        assert http.post(f"/api/v1/sessions/{finished}/finish", json={"reason": {"type": "success"}}).status_code == 200
        _wait_for(db_path, finished, finished_model, ("success", 1, "completed"), 30)

        silent, silent_model = silent_session
        _wait_for(db_path, silent, silent_model, ("expired", 1, "completed"), SESSION_TIMEOUT_S + 40)
        silent_s = _silent_for(db_path, silent, silent_model)
        assert silent_s >= SESSION_TIMEOUT_S, silent_s  # not before its time
        assert http.post("/api/v1/session_heartbeat", json={"session_id": silent}).status_code == 410
    # The SDK's own session heartbeats every 10 s, so it outlived the silent one, its model still loaded.
    assert _state(db_path, sdk_session, sdk_model) == (None, 0, None)
