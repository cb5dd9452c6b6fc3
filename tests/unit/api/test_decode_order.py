"""forward_backward reads a body's model_id and seq_id, checks the model's owner, and only then decodes the rest
(issue 45 #1): another user's model answers as a missing one before its datums are touched."""

from __future__ import annotations

import time
from collections.abc import Callable

import zstandard

from app.protocol.proto import pb
from tests.unit.api.conftest import InProcessApi, saved_checkpoint

CHUNKS = 4_000_000  # within the raised limits below; decoding them takes seconds (8 s on 6cc7317)


def empty_chunks_body(model_id: str, chunks: int) -> bytes:
    """One datum of `chunks` empty encoded_text chunks, zstd-compressed (a few KB)."""
    req = pb.ForwardBackwardRequest(model_id=model_id, seq_id=1, loss_fn="cross_entropy")
    datum = b"\x0a\x02\x0a\x00" * chunks
    length = bytearray()
    n = len(datum)
    while n >= 0x80:
        length.append(n & 0x7F | 0x80)
        n >>= 7
    length.append(n)
    return zstandard.ZstdCompressor().compress(req.SerializeToString() + b"\x1a" + bytes(length) + datum)


def post_proto(api: InProcessApi, body: bytes, user: str) -> tuple[int, dict, float]:
    headers = {**api.headers(user), "Content-Type": "application/x-protobuf", "Content-Encoding": "zstd"}
    started = time.monotonic()
    response = api.client.post("/api/v1/forward_backward", content=body, headers=headers)
    return response.status_code, response.json(), time.monotonic() - started


def test_another_users_model_is_refused_before_the_body_is_decoded(make_api: Callable[..., InProcessApi]) -> None:
    api = make_api(max_chunks_per_datum=2**23, max_chunks_per_request=2**23)
    bobs = saved_checkpoint(api, "bob").model_id
    status, body, elapsed = post_proto(api, empty_chunks_body(bobs, CHUNKS), "alice")
    assert status == 404 and bobs in body["error"], body
    assert elapsed < 1.0, f"refused after {elapsed:.1f} s: the body was decoded before the owner was checked"
