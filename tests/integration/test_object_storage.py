"""Checkpoints on an S3-compatible server (moto, on 127.0.0.1): the `sharded_app` keeps them in object storage
(its `storage_uri` is `s3://...`), so trainer workers upload, and samplers and loads download, through pyarrow's S3
filesystem. Nothing is written to the local checkpoint directory."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from app.storage.objects import ObjectStorage
from tests.integration.helpers import logprobs_of, new_client, sft_datums, train_steps
from tests.s3 import s3_keys


@pytest.fixture(scope="module")
def s3_storage(sharded_app: str, object_store: str) -> ObjectStorage:
    return ObjectStorage(object_store)


def test_checkpoints_round_trip_through_s3(
    s3_storage: ObjectStorage, sharded_client: tinker.ServiceClient, sharded_state_dir: Path
) -> None:
    local_before = sorted((sharded_state_dir / "checkpoints").rglob("*"))
    tc = new_client(sharded_client, seed=61)
    data = sft_datums(tc.get_tokenizer())
    train_steps(tc, data, 2)
    state = tc.save_state("on-s3").result().path
    sampler_path = tc.save_weights_for_sampler("s3-sampler").result().path
    expected = logprobs_of(tc.forward(data, "cross_entropy").result())
    assert any(k.endswith("/optimizer.pt") for k in s3_keys(s3_storage.uri, f"{tc.model_id}/weights/on-s3"))
    sampler_keys = s3_keys(s3_storage.uri, f"{tc.model_id}/sampler_weights")
    assert any(k.endswith("/adapter_model.safetensors") for k in sampler_keys)

    # Load: the new model's workers download the checkpoint; outputs and the next step are identical.
    restored = sharded_client.create_training_client_from_state_with_optimizer(state).result()
    for got, want in zip(logprobs_of(restored.forward(data, "cross_entropy").result()), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    train_steps(tc, data, 1)
    train_steps(restored, data, 1)
    for got, want in zip(
        logprobs_of(restored.forward(data, "cross_entropy").result()),
        logprobs_of(tc.forward(data, "cross_entropy").result()),
        strict=True,
    ):
        np.testing.assert_array_equal(got, want)

    # Sample: the sampler downloads the adapter; the saved weights are the 2-step ones, not the trained-on model.
    prompt = types.ModelInput.from_ints(data[0].model_input.to_ints()[:6])
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0)
    from_s3 = sharded_client.create_sampling_client(model_path=sampler_path).sample(prompt, 1, greedy).result()
    ephemeral = tc.save_weights_and_get_sampling_client().result().sample(prompt, 1, greedy).result()
    assert len(from_s3.sequences[0].tokens) == len(ephemeral.sequences[0].tokens) == 4
    assert s3_keys(s3_storage.uri, "ephemeral"), "ephemeral sampler weights belong in object storage too"

    # Export and download streamed from S3; delete removes the objects.
    rest = sharded_client.create_rest_client()
    export = tc.save_weights_external("s3-export").result().path
    urls = rest.get_external_weights_urls(export).result().urls
    with httpx.Client(timeout=30) as plain:
        config = plain.get(urls["adapter_config.json"])
    assert config.status_code == 200 and config.json()["r"] == 8
    rest.delete_checkpoint_from_tinker_path(state).result()
    assert s3_keys(s3_storage.uri, f"{tc.model_id}/weights/on-s3") == []
    with pytest.raises(tinker.NotFoundError):
        sharded_client.create_training_client_from_state(state).result()
    assert sorted((sharded_state_dir / "checkpoints").rglob("*")) == local_before
