"""Image and audio chunks through the real SDK on the suite's text-only base: forward_backward (protobuf, and JSON as
older SDKs send it) and sample answer at once with a user error naming the chunk's type and position (images on a
vision-language base: test_image_sampling, test_vlm_classifier)."""

from __future__ import annotations

import httpx
import pytest
import tinker
from tinker import types

from tests.integration.helpers import new_client

PNG = b"\x89PNG\r\n\x1a\n" + b"\x00" * 32
DMEL = bytes([0, 2, 4, 8]) + bytes(4 * 8 * 4)  # a TensorContainer header (float32, shape [4, 8]) and its zeros
IMAGE = ("image", types.ImageChunk(data=PNG, format="png", expected_tokens=4))
AUDIO = ("dmel", types.DmelChunk(dmel=DMEL))
WHY = {"image": "text-only", "dmel": "not served"}  # a text-only base takes no images; no base takes audio
POINTER = ("image_asset_pointer", types.ImageAssetPointerChunk(location="s3://b/a", format="png", expected_tokens=4))


def _with(chunk: types.ModelInputChunk) -> types.ModelInput:
    return types.ModelInput(chunks=[types.EncodedTextChunk(tokens=[1, 2, 3]), chunk])


@pytest.mark.parametrize("kind, chunk", [IMAGE, AUDIO])  # the SDK itself refuses to send a pointer as protobuf
def test_forward_backward_names_the_chunk(service_client, kind, chunk):  # type: ignore[no-untyped-def]
    tc = new_client(service_client, seed=51)
    n = 3 + chunk.length
    datum = types.Datum(model_input=_with(chunk), loss_fn_inputs={"target_tokens": [2] * n, "weights": [1.0] * n})
    with pytest.raises(
        tinker.RequestFailedError, match=rf"data\[0\]\.model_input\[1\] is a '{kind}' chunk; .*{WHY[kind]}"
    ):
        tc.forward_backward([datum], "cross_entropy").result(timeout=60)
    # the rejected seq_id did not stall the model: the next request runs
    text = types.Datum(model_input=types.ModelInput.from_ints([1, 2, 3]), loss_fn_inputs={"target_tokens": [2, 3, 4]})
    assert tc.forward([text], "cross_entropy").result(timeout=60).loss_fn_outputs


@pytest.mark.parametrize("kind, chunk", [IMAGE, AUDIO, POINTER])
def test_sample_names_the_chunk(service_client, kind, chunk):  # type: ignore[no-untyped-def]
    sampler = service_client.create_sampling_client(base_model="tinker-serve/tiny")
    with pytest.raises(tinker.BadRequestError, match=rf"prompt\.chunks\[1\] is a '{kind}' chunk"):
        sampler.sample(_with(chunk), num_samples=1, sampling_params=types.SamplingParams(max_tokens=4)).result(
            timeout=60
        )


def test_json_forward_backward_names_the_chunk(base_url, service_client):  # type: ignore[no-untyped-def]
    """Older SDKs send forward_backward as JSON; an audio (dmel) chunk there is refused the same way."""
    tc = new_client(service_client, seed=52)
    datum = {
        "model_input": {"chunks": [{"type": "encoded_text", "tokens": [1, 2]}, {"type": "dmel", "dmel": "AAAA"}]},
        "loss_fn_inputs": {"target_tokens": {"data": [2, 3], "dtype": "int64"}},
    }
    body = {
        "model_id": tc.model_id,
        "seq_id": 1,
        "forward_backward_input": {"data": [datum], "loss_fn": "cross_entropy"},
    }
    headers = {"X-API-Key": "tml-integration-tests"}
    future = httpx.post(f"{base_url}/api/v1/forward_backward", json=body, headers=headers).json()
    outcome = httpx.post(
        f"{base_url}/api/v1/retrieve_future", json={"request_id": future["request_id"]}, headers=headers, timeout=60
    ).json()
    assert "data[0].model_input.chunks[1] is a 'dmel' chunk" in str(outcome), outcome
