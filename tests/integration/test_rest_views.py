"""The REST views the SDK 0.38 calls beyond runs and checkpoints, through the real SDK and the `tinker` CLI: sessions
(list, get, search, project, trace export), copy_weights, and usage (tokens per session, checkpoint bytes per run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from click.testing import CliRunner
from tinker import types
from tinker.cli.__main__ import main_cli

from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import logprobs_of, new_client, sft_datums

API_KEY = "tml-integration-tests"
GREEDY = types.SamplingParams(max_tokens=6, temperature=0.0, seed=0)


def _cli_text(base_url: str, *args: str) -> str:
    """Run `tinker -f json ARGS` against the server in this process (the CLI's own click group, which its console
    script runs: a process of its own spends ~2.5 s of CPU importing torch through tinker.types); its standard
    output. Its clients are built from the environment given here (REST ones are session-less, kept per process
    by URL and key: every call here gives the same). test_cli_runs_and_checkpoints also runs it as a process."""
    env = {"TINKER_BASE_URL": base_url, "TINKER_API_KEY": API_KEY}
    done = CliRunner().invoke(main_cli, ["-f", "json", *args], env=env)
    assert done.exit_code == 0, (args, done.stdout, done.stderr, done.exception)
    return done.stdout


def _cli(base_url: str, *args: str) -> dict:
    """Run `tinker -f json ARGS` against the server; its JSON output."""
    return json.loads(_cli_text(base_url, *args))


def _hour_window() -> tuple[str, str]:
    start = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=1)
    return start.isoformat(), (start + timedelta(hours=3)).isoformat()


@pytest.fixture(scope="module")
def labelled(base_url: str) -> tinker.ServiceClient:
    """A session of its own, with a display name, metadata and a project."""
    client = tinker.ServiceClient(
        user_metadata={"suite": "rest-views", "run": uuid.uuid4().hex[:8]},
        project_id="proj-views",
        display_name="nightly rest views",
        base_url=base_url,
        api_key=API_KEY,
    )
    yield client
    client.close("success").result()


def test_sessions_trace_and_token_usage(labelled: tinker.ServiceClient, base_url: str, tmp_path: Path) -> None:
    tc = new_client(labelled, seed=71)
    session_id = tc.model_id.split(":")[0]
    datums = sft_datums(tc.get_tokenizer(), count=2)
    tc.forward_backward(datums, "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = datums[0].model_input
    sampled = sampler.sample(prompt, num_samples=2, sampling_params=GREEDY).result()

    rest = tinker.RestClient(base_url=base_url, api_key=API_KEY)
    assert session_id in rest.list_sessions(limit=1000).result().sessions
    page = rest.list_sessions(limit=1, offset=0).result().sessions
    assert len(page) == 1
    info = rest.get_session(session_id).result()
    assert info.training_run_ids == [tc.model_id] and len(info.sampler_ids) == 1
    assert info.user_metadata["suite"] == "rest-views" and info.display_name == "nightly rest views"

    run_tag = labelled._user_metadata["run"]  # type: ignore[index]
    found = rest.search_sessions(
        types.SessionSearchRequest(
            display_name="REST nightly",
            user_metadata={"run": run_tag},
            statuses=[types.ActiveSessionStatusQuery()],
            project_ids=["proj-views"],
        )
    ).result()
    assert [s.session_id for s in found.sessions] == [session_id] and found.next_cursor is None
    summary = found.sessions[0]
    assert summary.status is not None and summary.status.type == "active" and summary.project_id == "proj-views"
    finished = types.ClientFinishedSessionStatusQuery()
    nothing = types.SessionSearchRequest(user_metadata={"run": run_tag}, statuses=[finished])
    assert rest.search_sessions(nothing).result().sessions == []
    rest.assign_session_project(session_id, "proj-moved").result()
    moved = rest.search_sessions(types.SessionSearchRequest(project_ids=["proj-moved"])).result().sessions
    assert [s.session_id for s in moved] == [session_id]
    for _ in range(2):  # sessions newer than ours, so the first page of one is not the last
        httpx.post(f"{base_url}/api/v1/create_session", json={}, headers={"X-API-Key": API_KEY}).raise_for_status()
    first = rest.search_sessions(types.SessionSearchRequest(limit=1)).result()  # pages through every session
    second = rest.search_sessions(types.SessionSearchRequest(limit=1, cursor=first.next_cursor)).result()
    assert first.next_cursor is not None and second.sessions[0].session_id != first.sessions[0].session_id
    with pytest.raises(tinker.NotFoundError, match="session_id"):
        rest.get_session("no-such-session").result()

    trace = json.loads(urllib.request.urlopen(rest.export_session_trace(session_id).result()).read())
    slices = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    kinds = [e["name"] for e in slices]
    for kind in ("create_model", "forward_backward", "optim_step", "save_weights_for_sampler", "sample"):
        assert kind in kinds, kinds
    assert all(e["dur"] > 0 and e["args"]["state"] == "completed" for e in slices)
    cli_trace = _cli(base_url, "session", "export-trace", session_id, "-o", str(tmp_path / "t.json"))
    assert json.loads((tmp_path / "t.json").read_text())["otherData"]["session_id"] == session_id
    assert cli_trace["file_size_bytes"] > 0

    start, end = _hour_window()
    admin = tinker.AdminClient(base_url=base_url, api_key=API_KEY)
    usage = admin.get_billing_usage(start, end).result()
    mine: dict[str, int] = {}
    for event in usage.data:
        if event.session_id == session_id:
            mine[event.event_info.type] = mine.get(event.event_info.type, 0) + event.event_info.token_count
    expected = {
        "training": sum(d.model_input.length for d in datums),
        "sampling_prefill": prompt.length,
        "sampling_sample": sum(len(s.tokens) for s in sampled.sequences),
    }
    assert mine == expected
    assert usage.sessions[session_id].user_metadata["run"] == run_tag
    cli_usage = _cli(base_url, "billing", "usage", start, end)
    assert {(e["session_id"], e["event_info"]["type"]) for e in cli_usage["data"]} >= {
        (session_id, kind) for kind in expected
    }
    bad = httpx.get(
        f"{base_url}/api/v1/billing/usage/events",
        params={"starting_on": "2026-01-01T00:30:00Z", "ending_before": end},
        headers={"X-API-Key": API_KEY},
    )
    assert bad.status_code == 400 and bad.json()["field"] == "starting_on"


def test_copy_weights_is_independent_and_sampleable(
    service_client: tinker.ServiceClient, labelled: tinker.ServiceClient, base_url: str
) -> None:
    tc = new_client(service_client, seed=72)
    tc.forward_backward(sft_datums(tc.get_tokenizer(), count=2), "cross_entropy").result()
    tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    state = tc.save_state("c1").result().path
    sampler_path = tc.save_weights_for_sampler("s1").result().path
    rest = tinker.RestClient(base_url=base_url, api_key=API_KEY)

    copied = rest.copy_weights(state, "proj-copies").result()
    assert copied.endswith("/weights/c1") and copied != state
    copy_sampler = rest.copy_weights(sampler_path, "proj-copies").result()
    prompt = types.ModelInput.from_ints(tc.get_tokenizer().encode("What is 3 + 4?"))
    want = service_client.create_sampling_client(model_path=sampler_path).sample(prompt, 1, GREEDY).result()
    rest.delete_checkpoint_from_tinker_path(sampler_path).result()  # the copy has files of its own
    got = service_client.create_sampling_client(model_path=copy_sampler).sample(prompt, 1, GREEDY).result()
    assert got.sequences[0].tokens == want.sequences[0].tokens
    restored = service_client.create_training_client_from_state(copied).result()  # loads like the original
    probe = sft_datums(tc.get_tokenizer(), count=1)
    expected = logprobs_of(tc.forward(probe, "cross_entropy").result())
    np.testing.assert_allclose(logprobs_of(restored.forward(probe, "cross_entropy").result())[0], expected[0])

    storage = tinker.AdminClient(base_url=base_url, api_key=API_KEY)
    rows = storage.get_current_checkpoint_storage_usage(project_id="proj-copies").result().data
    copies = rest.list_user_checkpoints(limit=1000).result().checkpoints
    sizes = {c.tinker_path: c.size_bytes for c in copies}
    assert sorted(r.size_bytes for r in rows) == sorted([sizes[copied], sizes[copy_sampler]])
    cli_rows = _cli(base_url, "billing", "checkpoint-storage", "--project-id", "proj-copies")["data"]
    assert sorted(r["size_bytes"] for r in cli_rows) == sorted(r.size_bytes for r in rows)

    # Into another run of the same shape, by session and model slot: raw HTTP (the SDK sends a project only).
    other = new_client(service_client, seed=73)
    session_id, _, slot = other.model_id.split(":")
    http = httpx.Client(base_url=base_url, headers={"X-API-Key": API_KEY}, timeout=60)
    body = {"source_path": state, "session_id": session_id, "model_seq_id": int(slot)}
    key = {"X-Idempotency-Key": str(uuid.uuid4())}
    into = http.post("/api/v1/copy_weights", json=body, headers=key)
    assert into.json() == {"tinker_path": f"tinker://{other.model_id}/weights/c1"}
    assert http.post("/api/v1/copy_weights", json=body, headers=key).json() == into.json()  # a retry
    other.load_state(into.json()["tinker_path"]).result()
    collision = http.post("/api/v1/copy_weights", json=body)
    assert collision.status_code == 400 and collision.json()["field"] == "model_seq_id", collision.text
    narrower = new_client(service_client, seed=74, rank=4)
    _, _, narrow_slot = narrower.model_id.split(":")
    mismatch = http.post("/api/v1/copy_weights", json={**body, "model_seq_id": int(narrow_slot)})
    assert mismatch.status_code == 400 and mismatch.json()["field"] == "model_seq_id"
    with pytest.raises(tinker.NotFoundError, match="source_path"):
        rest.copy_weights(f"tinker://{tc.model_id}/weights/never", "proj-copies").result()
    with pytest.raises(tinker.BadRequestError, match="source_path"):
        rest.copy_weights("not-a-tinker-path", "proj-copies").result()
    unknown = http.post("/api/v1/copy_weights", json={**body, "session_id": "no-such-session"})
    assert unknown.status_code == 404 and unknown.json()["field"] == "session_id"


def test_cli_runs_and_checkpoints(service_client: tinker.ServiceClient, base_url: str, tmp_path: Path) -> None:
    """Every `tinker run` / `tinker checkpoint` / `tinker model` command that needs no Hugging Face Hub."""
    tc = new_client(service_client, seed=75)
    path = tc.save_state("cli").result().path
    env = {**os.environ, "TINKER_BASE_URL": base_url, "TINKER_API_KEY": API_KEY}
    as_a_process = [sys.executable, "-m", "tinker.cli", "-f", "json", "model", "list"]  # as a user runs it
    done = subprocess.run(as_a_process, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and BASE_MODEL in done.stdout, (done.stdout, done.stderr)
    assert tc.model_id in _cli_text(base_url, "run", "list", "--limit", "0")
    assert _cli(base_url, "run", "info", tc.model_id)["training_run_id"] == tc.model_id
    listed = _cli(base_url, "checkpoint", "list", "--run-id", tc.model_id)["checkpoints"]
    assert [c["tinker_path"] for c in listed] == [path]
    assert path in _cli_text(base_url, "checkpoint", "list", "--limit", "0")
    assert _cli(base_url, "checkpoint", "info", path)["tinker_path"] == path
    rest = tinker.RestClient(base_url=base_url, api_key=API_KEY)

    def mine() -> types.Checkpoint:
        (found,) = rest.list_checkpoints(tc.model_id).result().checkpoints
        return found

    _cli_text(base_url, "checkpoint", "publish", path)
    assert mine().public
    _cli_text(base_url, "checkpoint", "unpublish", path)
    assert not mine().public
    _cli_text(base_url, "checkpoint", "set-ttl", path, "--ttl", "7200")
    assert mine().expires_at is not None
    _cli_text(base_url, "checkpoint", "set-ttl", path, "--remove")
    assert mine().expires_at is None
    _cli_text(base_url, "checkpoint", "download", path, "-o", str(tmp_path))
    assert list(tmp_path.rglob("adapter_config.json")), sorted(tmp_path.rglob("*"))
    assert rest.list_checkpoints(tc.model_id).result().checkpoints == [mine()]  # its temporary export is gone
    _cli_text(base_url, "checkpoint", "delete", path, "-y")
    assert rest.list_checkpoints(tc.model_id).result().checkpoints == []
