"""image_asset_pointer chunks through the real API over SQLite, in process, in a forward_backward (JSON: protobuf has
no such chunk) and in an asample prompt on a vision-language base: a pointer inside `images.asset_roots` reaches the
trainer and the sampler as the image chunk with its file's bytes would; every other one is refused naming the chunk's
`location` (or `format`), before anything is queued, and one outside every root reads the same whether a file is there
or not (a `..` or a symlink out of a root included)."""

from __future__ import annotations

import base64
import io
import os
import struct
import time
import zlib
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from app.db.metadata import TrainingRun, model_id_for
from app.db.outcomes import Failed
from app.operations.forward_backward import ForwardBackward
from app.sampling.params import SampleArgs, SampleImage
from tests.unit.api.conftest import BASE_MODEL, InProcessApi, new_session
from tests.unit.api.test_sample_admission import _HoldingSamplers

VISION = {"patch_size": 16, "merge_size": 2, "temporal_patch_size": 2, "min_pixels": 1024, "max_pixels": 16384}
PAD = 999  # the image-pad token of the pretend vision-language base
TOKENS = 15  # a 150x100 image's vision tokens under VISION
MAX_IMAGE_BYTES = 4096
OUTSIDE = "data[0].model_input.chunks[1].location is not inside this server's image asset roots (images.asset_roots)"


def _encode(kind: str, size: tuple[int, int], noise: bool = False) -> bytes:
    pixels = np.random.default_rng(0).integers(0, 255, (size[1], size[0], 3)) if noise else np.full((*size[::-1], 3), 9)
    out = io.BytesIO()
    Image.fromarray(pixels.astype("uint8")).save(out, kind)
    return out.getvalue()


def _bomb() -> bytes:
    """A few bytes of PNG whose header claims 10000 x 10000 pixels."""
    ihdr = struct.pack(">IIBBBBB", 10_000, 10_000, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + struct.pack(">I", zlib.crc32(b"IHDR" + ihdr))


class _Samplers(_HoldingSamplers):
    """Holds every sample; keeps the arguments each was sent with."""

    def __init__(self) -> None:
        super().__init__()
        self.args: list[SampleArgs] = []

    def sample(self, base_model: str, request_id: str, adapter: str | None, args: SampleArgs, user: str) -> None:
        self.args.append(args)


class _Trainers:
    def __init__(self) -> None:
        self.submitted: list[Any] = []

    def submit(self, trainer: str, model_id: str, seq_id: int, op: Any, user: str) -> None:
        self.submitted.append(op)


class Lab:
    """The in-process API on a vision-language base with `assets` as its image asset root (or none: the default),
    and files in and beside it: `cat.png` (150x100), `big.png` (over limits.max_image_bytes), `jpeg.png` (a JPEG),
    `bomb.png` (a 100 megapixel header), `escape.png` (a symlink to `outside/secret.png`)."""

    def __init__(self, make_api: Callable[..., InProcessApi], tmp: Path, with_root: bool = True, **limits: int) -> None:
        self.root, self.outside = tmp / "assets", tmp / "outside"
        for folder in (self.root, self.outside):
            folder.mkdir()
        self.png = _encode("PNG", (150, 100))
        files = {"cat.png": self.png, "big.png": _encode("PNG", (64, 64), noise=True), "bomb.png": _bomb()}
        files["jpeg.png"] = _encode("JPEG", (150, 100))
        for name, data in files.items():
            (self.root / name).write_bytes(data)
        (self.outside / "secret.png").write_bytes(self.png)
        os.symlink(self.outside / "secret.png", self.root / "escape.png")
        images = {"asset_roots": [str(self.root)]} if with_root else None
        self.api = make_api(images=images, **{"max_image_bytes": MAX_IMAGE_BYTES, **limits})
        limits = self.api.services.model_limits
        limits[BASE_MODEL] = replace(limits[BASE_MODEL], vision=VISION, image_token_id=PAD)
        self.trainers = self.api.services.trainers = _Trainers()  # type: ignore[assignment]
        self.samplers = self.api.services.samplers = _Samplers()

    def train(self, *chunks: dict) -> ForwardBackward | dict:
        """A forward_backward of one datum [5, *chunks, 6]: the operation the trainer got, or its future's error."""
        session_id = new_session(self.api)
        model_id = model_id_for(session_id, 0)
        lora = {"rank": 4, "seed": 1, "train_attn": True, "train_mlp": True, "optimizer": "adamw"}
        run = TrainingRun(model_id, session_id, BASE_MODEL, 4, "policy", BASE_MODEL, lora, {}, time.time(), True)
        self.api.run(self.api.services.metadata.add_training_run(run))
        length = 2 + sum(chunk["expected_tokens"] for chunk in chunks)
        datum = {
            "model_input": {"chunks": [_text(5), *chunks, _text(6)]},
            "loss_fn_inputs": {"target_tokens": {"data": [1] * length, "dtype": "int64", "shape": [length]}},
        }
        body = {
            "model_id": model_id,
            "seq_id": 1,
            "forward_backward_input": {"loss_fn": "cross_entropy", "data": [datum]},
        }
        response = self.api.post("/api/v1/forward_backward", body)
        assert response.status_code == 200, response.text
        outcome = self.api.run(self.api.services.futures.get(response.json()["request_id"]))
        if isinstance(outcome, Failed):
            return outcome.error
        op = self.trainers.submitted[-1]
        assert isinstance(op, ForwardBackward), op
        return op

    def sample(self, chunk: dict) -> SampleArgs | dict:
        """An asample of the prompt [5, chunk, 6]: the arguments the sampler got, or the 400's body."""
        body = {"session_id": new_session(self.api), "sampling_session_seq_id": 0, "base_model": BASE_MODEL}
        sampler = self.api.post("/api/v1/create_sampling_session", body).json()["sampling_session_id"]
        prompt = {"chunks": [_text(5), chunk, _text(6)]}
        request = {"sampling_session_id": sampler, "seq_id": 1, "prompt": prompt, "sampling_params": {"max_tokens": 2}}
        response = self.api.post("/api/v1/asample", request)
        if response.status_code == 400:
            error: dict = response.json()
            return error
        assert response.status_code == 200, response.text
        return self.samplers.args[-1]


def _text(*tokens: int) -> dict:
    return {"type": "encoded_text", "tokens": list(tokens)}


def _pointer(location: str, fmt: str = "png", tokens: int = TOKENS) -> dict:
    return {"type": "image_asset_pointer", "location": location, "format": fmt, "expected_tokens": tokens}


@pytest.fixture
def lab(make_api: Callable[..., InProcessApi], tmp_path: Path) -> Lab:
    return Lab(make_api, tmp_path)


ROUTES = ("train", "sample")


def _refusal(lab: Lab, route: str, chunk: dict) -> dict:
    answer = getattr(lab, route)(chunk)
    assert isinstance(answer, dict) and answer["category"] == "user", answer
    # a prompt's chunk named as a forward_backward's is, for one table of expectations
    return {key: str(value).replace("prompt.chunks", "data[0].model_input.chunks") for key, value in answer.items()}


@pytest.mark.parametrize("route", ROUTES)
def test_a_pointer_inside_a_root_reaches_the_engines_as_its_image_chunk(lab: Lab, route: str) -> None:
    inline = {"type": "image", "format": "png", "data": base64.b64encode(lab.png).decode(), "expected_tokens": TOKENS}
    expected = getattr(lab, route)(inline)
    for location in (str(lab.root / "cat.png"), f"file://{lab.root}/sub/../cat.png"):
        got = getattr(lab, route)(_pointer(location))
        if route == "train":
            assert isinstance(got, ForwardBackward) and isinstance(expected, ForwardBackward), got
            assert got.args.batch.images == expected.args.batch.images and got.args.batch.images[0].data == lab.png
            np.testing.assert_array_equal(got.args.batch.tokens, expected.args.batch.tokens)
        else:
            assert isinstance(got, SampleArgs), got
            assert got.images == (SampleImage(start=1, length=TOKENS, data=lab.png),)
            assert isinstance(expected, SampleArgs) and replace(got, usage_session=None) == replace(
                expected, usage_session=None
            )  # each in a session of its own


@pytest.mark.parametrize("route", ROUTES)
def test_a_location_outside_every_root_reads_the_same_whether_a_file_is_there_or_not(lab: Lab, route: str) -> None:
    locations = [
        lab.outside / "secret.png",  # a file outside
        lab.outside / "nothing.png",  # nothing outside
        f"{lab.root}/../outside/secret.png",  # `..` out of the root
        f"{lab.root}/../outside/nothing.png",
        lab.root / "escape.png",  # a symlink out of the root
        f"file://{lab.outside}/secret.png",
        f"{lab.root}-sibling/cat.png",  # a sibling sharing the root's name as a prefix
    ]
    for location in locations:
        error = _refusal(lab, route, _pointer(str(location)))
        assert (error["field"], error["error"]) == ("data[0].model_input.chunks[1].location", OUTSIDE), location


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize(
    ("location", "field", "says"),
    [
        ("https://example.com/cat.png", "location", "is an https URL: this server fetches nothing from the network"),
        ("http://10.0.0.1/cat.png", "location", "is an http URL: this server fetches nothing from the network"),
        ("{root}/missing.png", "location", "names no file: nothing is there"),
        ("{root}", "location", "is not inside"),  # the root itself is no file in it
        ("cat.png", "location", "must be an absolute path, a file:// URL or an s3:// or gs:// URL"),
        ("{root}/big.png", "location", "names a file of "),
        ("{root}/jpeg.png", "format", "location is a jpeg image but format says 'png'"),
        ("{root}/bomb.png", "location", "10000x10000 = 100000000 pixels, over 40000000 (limits.max_image_pixels)"),
    ],
    ids=["https", "http", "missing", "the root", "relative", "too large", "header says jpeg", "header says 100 MP"],
)
def test_a_pointer_that_cannot_be_served_is_refused_naming_it(
    lab: Lab, route: str, location: str, field: str, says: str
) -> None:
    error = _refusal(lab, route, _pointer(location.format(root=lab.root)))
    assert error["field"] == f"data[0].model_input.chunks[1].{field}" and says in error["error"], error
    if "big" in location:
        size = (lab.root / "big.png").stat().st_size
        assert f"{size} bytes, over {MAX_IMAGE_BYTES} (limits.max_image_bytes)" in error["error"], error


@pytest.mark.parametrize("route", ROUTES)
def test_without_asset_roots_every_pointer_is_refused_naming_the_config_key(
    make_api: Callable[..., InProcessApi], tmp_path: Path, route: str
) -> None:
    lab = Lab(make_api, tmp_path, with_root=False)
    error = _refusal(lab, route, _pointer(str(lab.root / "cat.png")))
    assert error["field"] == "data[0].model_input.chunks[1].location", error
    assert "images.asset_roots is empty" in error["error"], error


def test_a_requests_files_count_against_the_bytes_its_body_leaves(
    make_api: Callable[..., InProcessApi], tmp_path: Path
) -> None:
    """Images by location take what the body leaves of limits.max_request_bytes, as if they had been sent in it."""
    lab = Lab(make_api, tmp_path, max_request_bytes=4096)
    image = _encode("PNG", (28, 28), noise=True)  # one vision token; about 2.4 KB of noise
    (lab.root / "noise.png").write_bytes(image)
    pointer = _pointer(str(lab.root / "noise.png"), tokens=1)
    assert isinstance(lab.train(pointer), ForwardBackward)
    error = lab.train(pointer, pointer)
    assert isinstance(error, dict) and error["field"] == "data[0].model_input.chunks[2].location", error
    assert f"images by location make {2 * len(image)} bytes" in error["error"], error
    assert "limits.max_request_bytes" in error["error"], error
