"""`sampler.kv_cache_mib: auto`: one whole context of the base, at least the floor, at most a share of memory."""

from __future__ import annotations

from app.models.model_config import ModelShape
from app.sampling.kv_budget import AUTO_FLOOR_MIB, auto_kv_cache_mib

GIB = 2**30
# Qwen3-0.6B: 28 layers x 8 key-value heads x head_dim 128, keys and values: 57,344 values a token
QWEN3_06B = ModelShape(vocab_size=151936, max_position_embeddings=40960, kv_values_per_token=28 * 8 * 128 * 2)
TINY = ModelShape(vocab_size=2048, max_position_embeddings=2048, kv_values_per_token=2 * 2 * 32 * 2)


def test_a_real_models_whole_context_where_memory_allows() -> None:
    mib, why = auto_kv_cache_mib(QWEN3_06B, 40960, 2, memory_bytes=64 * GIB)
    held = QWEN3_06B.kv_cache_tokens(mib * 2**20, 2)
    assert held is not None and 40960 <= held < 40960 + 2 * 128  # the whole context, within a block or two
    assert "40960-token context" in why


def test_at_most_an_eighth_of_the_machine() -> None:
    mib, why = auto_kv_cache_mib(QWEN3_06B, 40960, 2, memory_bytes=24 * GIB)
    assert mib == 3 * 1024 and "1/8 of this machine's 24 GiB" in why


def test_a_tiny_model_gets_the_floor() -> None:
    assert auto_kv_cache_mib(TINY, 2048, 4, memory_bytes=24 * GIB)[0] == AUTO_FLOOR_MIB
