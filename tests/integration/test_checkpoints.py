"""Checkpoints through the SDK: save_state, create_training_client_from_state[_with_optimizer] and load_state
reproduce outputs exactly (and, with the optimizer, the next step), critics included; the RestClient's list,
delete, publish, TTL and pagination; exports downloaded by signed URL and by the `tinker` CLI; and names that
try to leave the storage root."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from safetensors.torch import load_file
from tinker import types

from tests.integration.conftest import BASE_MODEL, MIN_CHECKPOINT_TTL_S
from tests.integration.helpers import (
    critic_datums,
    logprobs_of,
    new_client,
    sft_datums,
    stored_directory,
    values_of,
)

ADAM = types.AdamParams(learning_rate=1e-2)


def policy_outputs(tc: tinker.TrainingClient, data: list[types.Datum]) -> list[np.ndarray]:
    return logprobs_of(tc.forward(data, "cross_entropy").result())


def train(tc: tinker.TrainingClient, data: list[types.Datum], loss: str) -> None:
    tc.forward_backward(data, loss).result()
    tc.optim_step(ADAM).result()


def assert_same(a: list[np.ndarray], b: list[np.ndarray]) -> None:
    for x, y in zip(a, b, strict=True):
        np.testing.assert_array_equal(x, y)


def test_policy_round_trip(service_client: tinker.ServiceClient) -> None:
    source = new_client(service_client, seed=51)
    data = sft_datums(source.get_tokenizer(), 3)
    for _ in range(2):
        train(source, data, "cross_entropy")
    saved = source.save_state("c1").result().path
    assert saved == f"tinker://{source.model_id}/weights/c1"
    sampler_weights = source.save_weights_for_sampler("c1").result().path
    prompt = types.ModelInput.from_ints(data[0].model_input.to_ints()[:6])
    greedy = types.SamplingParams(max_tokens=6, temperature=0.0)
    from_checkpoint, from_sampler_weights = (
        service_client.create_sampling_client(model_path=p).sample(prompt, 1, greedy).result().sequences[0]
        for p in (saved, sampler_weights)
    )
    assert from_checkpoint.tokens == from_sampler_weights.tokens  # a training checkpoint samples as is
    np.testing.assert_allclose(from_checkpoint.logprobs, from_sampler_weights.logprobs, atol=1e-5)

    full = service_client.create_training_client_from_state_with_optimizer(saved).result()
    weights_only = service_client.create_training_client_from_state(saved).result()
    assert len({source.model_id, full.model_id, weights_only.model_id}) == 3
    before = policy_outputs(source, data)
    assert_same(policy_outputs(full, data), before)
    assert_same(policy_outputs(weights_only, data), before)
    for tc in (source, full, weights_only):
        train(tc, data, "cross_entropy")
    after = policy_outputs(source, data)
    assert_same(policy_outputs(full, data), after)  # the optimizer state came back too
    assert not all(np.array_equal(x, y) for x, y in zip(policy_outputs(weights_only, data), after))

    loaded = new_client(service_client, seed=52)  # load_state into an existing model of the same shape
    loaded.load_state(saved).result()
    assert_same(policy_outputs(loaded, data), before)


def test_critic_round_trip(service_client: tinker.ServiceClient, state_dir: Path) -> None:
    critic = service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, seed=53, user_metadata={"model_role": "critic"}
    ).result()
    tokenizer = critic.get_tokenizer()
    bare = critic_datums(tokenizer)
    for _ in range(2):
        train(critic, critic_datums(tokenizer, values_of(critic.forward(bare, "ppo").result())), "ppo")
    saved = critic.save_state("v1").result().path
    with pytest.raises(tinker.BadRequestError, match="critic"):
        service_client.create_sampling_client(model_path=saved).result()
    restored = service_client.create_training_client_from_state_with_optimizer(saved).result()
    current = values_of(critic.forward(bare, "ppo").result())
    assert np.abs(np.concatenate(current)).max() > 0  # the value head was trained and came back
    assert_same(values_of(restored.forward(bare, "ppo").result()), current)
    step_data = critic_datums(tokenizer, current)
    for tc in (critic, restored):
        train(tc, step_data, "ppo")
    assert_same(values_of(restored.forward(bare, "ppo").result()), values_of(critic.forward(bare, "ppo").result()))
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        route = db.execute(
            "SELECT role, trainer FROM training_runs WHERE model_id = ?", (restored.model_id,)
        ).fetchone()
    assert route == ("critic", f"{BASE_MODEL}:critic")


def test_checkpoint_errors(service_client: tinker.ServiceClient) -> None:
    tc = new_client(service_client, seed=54)
    tc.save_state("dup").result()
    with pytest.raises(tinker.RequestFailedError, match="already exists"):
        tc.save_state("dup").result()
    assert tc.save_state("dup", overwrite=True).result().path.endswith("/weights/dup")
    sampler_path = tc.save_weights_for_sampler("s").result().path
    with pytest.raises(tinker.BadRequestError, match="path"):
        service_client.create_training_client_from_state(sampler_path).result()
    with pytest.raises(tinker.NotFoundError, match="path"):
        service_client.create_training_client_from_state(f"tinker://{tc.model_id}/weights/never").result()
    smaller = service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=1).result()
    with pytest.raises(tinker.RequestFailedError, match="rank-8 policy") as info:
        smaller.load_state(f"tinker://{tc.model_id}/weights/dup").result()
    assert info.value.category is types.RequestErrorCategory.User


def test_rest_list_describe_delete(service_client: tinker.ServiceClient, base_url: str) -> None:
    tc = new_client(service_client, seed=55)
    rest = service_client.create_rest_client()
    state = tc.save_state("c1").result().path
    sampler = tc.save_weights_for_sampler("s1").result().path
    listed = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert {(c.checkpoint_id, c.checkpoint_type, c.tinker_path) for c in listed} == {
        ("weights/c1", "training", state),
        ("sampler_weights/s1", "sampler", sampler),
    }
    assert all(c.size_bytes > 0 for c in listed)
    assert rest.get_training_run_by_tinker_path(sampler).result().base_model == BASE_MODEL
    info = rest.get_weights_info_by_tinker_path(state).result()
    assert (info.base_model, info.is_lora, info.lora_rank) == (BASE_MODEL, True, 8)

    rest.delete_checkpoint_from_tinker_path(state).result()
    assert [c.checkpoint_id for c in rest.list_checkpoints(tc.model_id).result().checkpoints] == ["sampler_weights/s1"]
    with pytest.raises(tinker.NotFoundError):
        service_client.create_training_client_from_state(state).result()
    with pytest.raises(tinker.NotFoundError):
        rest.delete_checkpoint_from_tinker_path(state).result()
    with httpx.Client(base_url=base_url, timeout=30, headers={"X-API-Key": "tml-integration-tests"}) as http:
        for bad in (
            "weights/%2E%2E",
            "sampler_weights/%2E%2E%2F%2E%2E%2Fsampler_weights%2Fs1",
            "secrets/c1",
            "sampler_weights/s1%2F..%2F..%2F..%2Fx",
        ):  # percent-encoded, so no client normalises them
            answer = http.delete(f"/api/v1/training_runs/{tc.model_id}/checkpoints/{bad}")
            assert answer.status_code == 400 and "checkpoint_id" in answer.text, (bad, answer.text)
    assert [c.checkpoint_id for c in rest.list_checkpoints(tc.model_id).result().checkpoints] == ["sampler_weights/s1"]

    # Pagination as the CLI does it: offset += page length until total_count.
    seen, offset = [], 0
    while True:
        page = rest.list_training_runs(limit=3, offset=offset).result()
        seen += [r.training_run_id for r in page.training_runs]
        offset += len(page.training_runs)
        if offset >= page.cursor.total_count:
            break
    assert tc.model_id in seen and len(seen) == len(set(seen)) == page.cursor.total_count
    everyone = rest.list_user_checkpoints(limit=1000).result().checkpoints
    assert sampler in {c.tinker_path for c in everyone} and state not in {c.tinker_path for c in everyone}


def test_publish_ttl_expiry_and_metadata(service_client: tinker.ServiceClient, state_dir: Path) -> None:
    tc = new_client(service_client, seed=56)
    rest = service_client.create_rest_client()
    with pytest.raises(tinker.RequestFailedError, match="ttl_seconds") as info:
        tc.save_state("too-short", ttl_seconds=MIN_CHECKPOINT_TTL_S - 1).result()
    assert info.value.category is types.RequestErrorCategory.User
    path = tc.save_state("kept", ttl_seconds=3600, user_metadata={"step": "3"}).result().path
    (listed,) = rest.list_checkpoints(tc.model_id).result().checkpoints
    assert (listed.user_metadata, listed.public) == ({"step": "3"}, False)
    assert 3500 < (listed.expires_at - listed.time).total_seconds() < 3700

    rest.publish_checkpoint_from_tinker_path(path).result()
    rest.publish_checkpoint_from_tinker_path(path).result()  # twice is harmless
    assert rest.list_checkpoints(tc.model_id).result().checkpoints[0].public is True
    rest.unpublish_checkpoint_from_tinker_path(path).result()
    assert rest.list_checkpoints(tc.model_id).result().checkpoints[0].public is False
    rest.set_checkpoint_ttl_from_tinker_path(path, None).result()
    assert rest.list_checkpoints(tc.model_id).result().checkpoints[0].expires_at is None
    with pytest.raises(tinker.BadRequestError, match="ttl_seconds"):
        rest.set_checkpoint_ttl_from_tinker_path(path, 1).result()
    with pytest.raises(tinker.NotFoundError, match="checkpoint_id"):
        rest.publish_checkpoint_from_tinker_path(f"tinker://{tc.model_id}/weights/never").result()

    # Expiry: invisible at once when the TTL passes, files removed by the next sweep (every second here).
    directory = stored_directory(state_dir, path)
    rest.set_checkpoint_ttl_from_tinker_path(path, MIN_CHECKPOINT_TTL_S).result()
    assert directory.is_dir()
    time.sleep(MIN_CHECKPOINT_TTL_S + 0.5)
    assert rest.list_checkpoints(tc.model_id).result().checkpoints == []
    with pytest.raises(tinker.NotFoundError, match="expired"):
        service_client.create_training_client_from_state(path).result()
    deadline = time.monotonic() + 10
    while directory.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not directory.exists(), "the expired checkpoint's files were not swept"
    assert tc.save_state("kept").result().path == path  # the name is free again


def test_export_and_cli_download(
    service_client: tinker.ServiceClient, base_url: str, state_dir: Path, tmp_path: Path
) -> None:
    tc = new_client(service_client, seed=57)
    tc.forward_backward(sft_datums(tc.get_tokenizer()), "cross_entropy").result()
    tc.optim_step(ADAM).result()
    state = tc.save_state("final").result().path
    export = tc.save_weights_external("e1").result().path
    assert export == f"tinker://{tc.model_id}/external_weights/e1"
    rest = service_client.create_rest_client()
    signed = rest.get_external_weights_urls(export).result()
    assert sorted(signed.urls) == ["adapter_config.json", "adapter_model.safetensors"]
    with httpx.Client(timeout=30) as plain:  # no API key: the signature authorises
        weights = plain.get(signed.urls["adapter_model.safetensors"])
        assert weights.status_code == 200
        assert weights.content == (stored_directory(state_dir, export) / "adapter_model.safetensors").read_bytes()
        tampered = signed.urls["adapter_config.json"].replace("adapter_config.json", "adapter_model.safetensors")
        assert plain.get(tampered).status_code == 403
        # Only exports have download links (the SDK checks this too; other clients meet the server's check).
        refused = plain.get(
            f"{base_url}/api/v1/training_runs/{tc.model_id}/checkpoints/weights/final/external_weights_urls",
            headers={"X-API-Key": "tml-integration-tests"},
        )
        assert refused.status_code == 400 and refused.json()["field"] == "checkpoint_id"
    with pytest.raises(tinker.RequestFailedError, match="age_encryption_recipients"):
        tc.save_weights_external("e2", age_encryption_recipients=["age1xyz"]).result()

    # The CLI downloads a training checkpoint by exporting it through a temporary model, then deletes the export.
    env = {**os.environ, "TINKER_BASE_URL": base_url, "TINKER_API_KEY": "tml-integration-tests"}
    done = subprocess.run(
        [str(Path(sys.executable).parent / "tinker"), "checkpoint", "download", state, "--output", str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    (downloaded,) = tmp_path.iterdir()
    got = load_file(str(downloaded / "adapter_model.safetensors"))
    want = load_file(str(stored_directory(state_dir, state) / "adapter_model.safetensors"))
    assert got.keys() == want.keys() and all(np.array_equal(got[k].numpy(), want[k].numpy()) for k in want)
    assert [
        c.checkpoint_id
        for c in rest.list_user_checkpoints(limit=1000).result().checkpoints
        if c.checkpoint_id == "external_weights/download"
    ] == []  # the CLI's temporary export is gone


@pytest.mark.parametrize(
    "field, call",
    [
        ("path", lambda tc, sc, rest: tc.save_state("../escape").result()),
        ("path", lambda tc, sc, rest: tc.save_state("/etc/passwd").result()),
        ("path", lambda tc, sc, rest: tc.save_weights_for_sampler("..").result()),
        ("path", lambda tc, sc, rest: tc.save_weights_external("a/../../b").result()),
        ("path", lambda tc, sc, rest: tc.load_state(f"tinker://{tc.model_id}/weights/..").result()),
        ("path", lambda tc, sc, rest: sc.create_training_client_from_state("tinker://../weights/x").result()),
        (
            "model_path",
            lambda tc, sc, rest: sc.create_sampling_client(model_path="tinker://m/sampler_weights/%2E%2E").result(),
        ),
        ("tinker_path", lambda tc, sc, rest: rest.get_weights_info_by_tinker_path("tinker://..%2F/weights/x").result()),
        ("tinker_path", lambda tc, sc, rest: rest.get_training_run_by_tinker_path("tinker://../weights/x").result()),
    ],
)
def test_traversal_in_every_name_field_is_refused(service_client: tinker.ServiceClient, state_dir: Path, field, call):
    tc = _traversal_client(service_client)
    before = sorted(p.relative_to(state_dir) for p in state_dir.rglob("*"))
    with pytest.raises((tinker.APIStatusError, tinker.RequestFailedError, ValueError)) as info:
        call(tc, service_client, service_client.create_rest_client())
    error = info.value  # a ValueError is the SDK refusing it before sending
    if isinstance(error, tinker.APIStatusError):  # (a URL path with `..` is normalised, so no route names a field)
        assert error.status_code in (400, 404) and error.body.get("field", field) == field, error.body
    elif isinstance(error, tinker.RequestFailedError):
        assert error.category is types.RequestErrorCategory.User and "checkpoint name" in error.message
    created = {p for p in sorted(p.relative_to(state_dir) for p in state_dir.rglob("*")) if p not in before}
    assert not {p for p in created if "checkpoints" in p.parts}, created


_TRAVERSAL_CLIENT: list[tinker.TrainingClient] = []


def _traversal_client(service_client: tinker.ServiceClient) -> tinker.TrainingClient:
    if not _TRAVERSAL_CLIENT:
        _TRAVERSAL_CLIENT.append(new_client(service_client, seed=58, rank=4))
    return _TRAVERSAL_CLIENT[0]
