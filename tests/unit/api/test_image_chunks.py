"""forward_backward with image chunks through the real API over SQLite, in process: a text-only base refuses them
naming the chunk, a vision-language base checks each from its header against its processor and the image limits
before anything is queued (a 10 KB PNG claiming 100 megapixels, a wrong expected_tokens), and hands a valid one to
the trainer with its bytes. A refused request's future fails as a user error and the trainer skips its seq_id."""

from __future__ import annotations

import base64
import io
import struct
import time
import zlib
from dataclasses import replace
from typing import Any

import pytest
from PIL import Image

from app.db.metadata import TrainingRun, model_id_for
from app.db.outcomes import Failed
from app.messages import Skip
from app.operations.forward_backward import ForwardBackward
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session

TINY_VISION = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 1024, "max_pixels": 16384}


class _Trainers:
    def __init__(self) -> None:
        self.submitted: list[Any] = []

    def submit(self, trainer: str, model_id: str, seq_id: int, op: Any, user: str) -> None:
        self.submitted.append(op)


def _png(size: tuple[int, int]) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, (1, 2, 3)).save(buf, format="PNG")
    return buf.getvalue()


def _bomb() -> bytes:
    """10 KB of PNG whose header claims 10000 x 10000 pixels."""
    ihdr = struct.pack(">IIBBBBB", 10_000, 10_000, 8, 2, 0, 0, 0)
    chunk = struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))
    return (b"\x89PNG\r\n\x1a\n" + chunk).ljust(10_000, b"\x00")


def _send(api: InProcessApi, image: bytes, expected_tokens: int, vision: bool) -> tuple[Any, _Trainers]:
    if vision:
        limits = api.services.model_limits
        limits[BASE_MODEL] = replace(limits[BASE_MODEL], vision=TINY_VISION)
    session_id = new_session(api)
    model_id = model_id_for(session_id, 0)
    lora = {"rank": 4, "seed": 1, "train_attn": True, "train_mlp": True, "optimizer": "adamw"}
    run = TrainingRun(model_id, session_id, BASE_MODEL, 4, "policy", BASE_MODEL, lora, {}, time.time(), True)
    api.run(api.services.metadata.add_training_run(run))
    trainers = api.services.trainers = _Trainers()  # type: ignore[assignment]
    length = 2 + expected_tokens
    chunks = [
        {"type": "encoded_text", "tokens": [5]},
        {
            "type": "image",
            "format": "png",
            "data": base64.b64encode(image).decode(),
            "expected_tokens": expected_tokens,
        },
        {"type": "encoded_text", "tokens": [6]},
    ]
    datum = {
        "model_input": {"chunks": chunks},
        "loss_fn_inputs": {"target_tokens": {"data": [1] * length, "dtype": "int64", "shape": [length]}},
    }
    fbi = {"loss_fn": "cross_entropy", "data": [datum]}
    response = api.post("/api/v1/forward_backward", {"model_id": model_id, "seq_id": 1, "forward_backward_input": fbi})
    assert response.status_code == 200, response.text
    return api.run(api.services.futures.get(response.json()["request_id"])), trainers


@pytest.mark.parametrize(
    ("image", "tokens", "vision", "field", "says"),
    [
        (_png((150, 100)), 15, False, "data[0].model_input.chunks[1]", "this base model is text-only"),
        (
            _bomb(),
            16,
            True,
            "data[0].model_input.chunks[1].data",
            "10000x10000 = 100000000 pixels, over 40000000 (limits.max_image_pixels)",
        ),
        (_png((150, 100)), 14, True, "data[0].model_input.chunks[1].expected_tokens", "makes 15 tokens"),
    ],
    ids=["text-only base", "100 megapixel header", "wrong expected_tokens"],
)
def test_a_refused_image_fails_its_future_naming_the_chunk(
    api: InProcessApi, image: bytes, tokens: int, vision: bool, field: str, says: str
) -> None:
    outcome, trainers = _send(api, image, tokens, vision)
    assert isinstance(outcome, Failed) and outcome.error["category"] == "user", outcome
    assert outcome.error["field"] == field and says in outcome.error["error"], outcome.error
    assert [type(op) for op in trainers.submitted] == [Skip]


def test_a_valid_image_reaches_the_trainer_with_its_bytes(api: InProcessApi) -> None:
    png = _png((150, 100))
    _, trainers = _send(api, png, 15, vision=True)
    (op,) = trainers.submitted
    assert isinstance(op, ForwardBackward), op
    (image,) = op.args.batch.images
    assert (image.datum, image.position, image.tokens, image.data) == (0, 1, 15, png)
