"""Sampling results, engine-neutral, and their wire forms: protobuf `SampleResponse` and its JSON view."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from app.protocol.proto import pb

TopK = list[tuple[int, float]]  # (token id, logprob), best first
_STOP_REASONS = {"stop": pb.STOP_REASON_STOP, "length": pb.STOP_REASON_LENGTH}
_EMPTY_CELL = (0, -99999.0)  # the SDK's sentinel for a missing top-k entry


@dataclass(frozen=True)
class SampledSequence:
    tokens: list[int]
    logprobs: list[float]
    stop_reason: Literal["stop", "length"]
    topk_logprobs: list[TopK | None] | None = None  # None at a step whose top-k is empty


@dataclass(frozen=True)
class SampleResult:
    sequences: list[SampledSequence]
    prompt_logprobs: list[float | None] | None = None  # None where not computed (position 0, before last N)
    topk_prompt_logprobs: list[TopK | None] | None = None
    prompt_cache_hit_tokens: int = 0


def _topk_proto(rows: Sequence[TopK | None], k: int) -> pb.TopkLogprobs:
    ids = np.full((len(rows), k), _EMPTY_CELL[0], dtype="<i4")
    lps = np.full((len(rows), k), _EMPTY_CELL[1], dtype="<f4")
    for i, row in enumerate(rows):
        for j, (token, logprob) in enumerate((row or [])[:k]):
            ids[i, j], lps[i, j] = token, logprob
    return pb.TopkLogprobs(token_ids=ids.tobytes(), logprobs=lps.tobytes(), k=k, length=len(rows))


def encode_sample_response(result: SampleResult, *, topk_prompt: int = 0, topk_sample: int = 0) -> bytes:
    """The protobuf the SDK decodes; k is the requested top-k (rows may be shorter near the vocab end)."""
    msg = pb.SampleResponse(prompt_cache_hit_tokens=result.prompt_cache_hit_tokens)
    for seq in result.sequences:
        out = msg.sequences.add(
            stop_reason=_STOP_REASONS[seq.stop_reason],
            tokens=np.asarray(seq.tokens, dtype="<i4").tobytes(),
            logprobs=np.asarray(seq.logprobs, dtype="<f4").tobytes(),
        )
        if topk_sample and seq.topk_logprobs is not None:
            out.topk_sampled_logprobs.CopyFrom(_topk_proto(seq.topk_logprobs, topk_sample))
    if result.prompt_logprobs is not None:
        values = [math.nan if lp is None else lp for lp in result.prompt_logprobs]
        msg.prompt_logprobs = np.asarray(values, dtype="<f4").tobytes()
    if topk_prompt and result.topk_prompt_logprobs is not None:
        msg.topk_prompt_logprobs.CopyFrom(_topk_proto(result.topk_prompt_logprobs, topk_prompt))
    return msg.SerializeToString()


def _topk_json(topk: pb.TopkLogprobs) -> list[TopK | None]:
    ids = np.frombuffer(topk.token_ids, dtype="<i4").reshape(topk.length, topk.k)
    lps = np.frombuffer(topk.logprobs, dtype="<f4").reshape(topk.length, topk.k)
    rows: list[TopK | None] = []
    for row_ids, row_lps in zip(ids.tolist(), lps.tolist()):
        row = [(t, lp) for t, lp in zip(row_ids, row_lps) if (t, lp) != _EMPTY_CELL]
        rows.append(row or None)
    return rows


def sample_json_from_proto(payload: bytes) -> dict[str, Any]:
    """The JSON view of a stored SampleResponse, for clients that poll without the protobuf Accept header."""
    msg = pb.SampleResponse.FromString(payload)
    reasons = {v: k for k, v in _STOP_REASONS.items()}
    sequences = []
    for seq in msg.sequences:
        entry: dict[str, Any] = {
            "stop_reason": reasons[seq.stop_reason],
            "tokens": np.frombuffer(seq.tokens, dtype="<i4").tolist(),
            "logprobs": np.frombuffer(seq.logprobs, dtype="<f4").tolist(),
        }
        if seq.HasField("topk_sampled_logprobs"):
            entry["topk_logprobs"] = _topk_json(seq.topk_sampled_logprobs)
        sequences.append(entry)
    body: dict[str, Any] = {
        "type": "sample",
        "sequences": sequences,
        "prompt_cache_hit_tokens": msg.prompt_cache_hit_tokens,
    }
    if msg.prompt_logprobs:
        body["prompt_logprobs"] = [
            None if math.isnan(v) else v for v in np.frombuffer(msg.prompt_logprobs, dtype="<f4").tolist()
        ]
    if msg.HasField("topk_prompt_logprobs"):
        body["topk_prompt_logprobs"] = _topk_json(msg.topk_prompt_logprobs)
    return body
