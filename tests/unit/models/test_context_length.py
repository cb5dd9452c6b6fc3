"""A base model's context follows its config.json: max_position_embeddings (a multimodal model's text_config's), or
what a yarn, dynamic or linear RoPE scaling gives; the served context (training's datums, the Sampler's max_model_len)
is it, capped by a configured max_context_length and on CPU by what the Sampler's KV cache holds."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from app.config import BaseModelConfig
from app.models.model_config import ModelShape, model_shape
from deployments.builder import _context_length

QWEN3 = {"model_type": "qwen3", "vocab_size": 151936, "max_position_embeddings": 32768}
YARN_4X = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}


def shape_of(tmp_path: Path, config: dict[str, Any]) -> ModelShape:
    model = tmp_path / f"model{len(list(tmp_path.iterdir()))}"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(config))
    return model_shape(str(model))


def test_the_context_is_the_positions_or_what_rope_scaling_gives(tmp_path: Path) -> None:
    def context(**config: Any) -> int:
        return shape_of(tmp_path, QWEN3 | config).context_length

    assert context() == 32768
    assert context(rope_scaling={"type": "yarn", "factor": 4.0}) == 131072  # over max_position_embeddings
    assert context(max_position_embeddings=40960, rope_parameters=YARN_4X) == 131072  # Qwen3's recipe: over original
    assert context(rope_parameters={"rope_type": "linear", "factor": 2.0}) == 65536
    dynamic = {"rope_type": "dynamic", "factor": 16.0}
    assert context(rope_parameters=dynamic, original_max_position_embeddings=4096) == 65536  # Phi-3's place for it
    # DeepSeek-V3's: max_position_embeddings is the scaled context already (4096 x 40)
    deepseek = {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096}
    assert context(max_position_embeddings=163840, rope_scaling=deepseek) == 163840
    # Llama 3.1's own scaling: max_position_embeddings is its context
    llama3 = {"rope_type": "llama3", "factor": 8.0, "original_max_position_embeddings": 8192}
    assert context(max_position_embeddings=131072, rope_scaling=llama3) == 131072
    # transformers 5's per layer type
    assert context(rope_parameters={"full_attention": YARN_4X, "sliding_attention": {"rope_type": "default"}}) == 131072
    assert context(rope_parameters={"rope_type": "default", "rope_theta": 1e6}) == 32768


def test_a_multimodal_models_context_is_its_text_configs(tmp_path: Path) -> None:
    config = {"model_type": "qwen3_5", "text_config": QWEN3 | {"rope_parameters": YARN_4X}, "vision_config": {}}
    assert shape_of(tmp_path, config).context_length == 131072


def test_the_served_context_follows_the_model_and_a_configured_one_caps_it(tmp_path: Path) -> None:
    shape = shape_of(tmp_path, QWEN3 | {"rope_scaling": YARN_4X})

    def served(max_context_length: int | None, **sampler: Any) -> int:
        base = BaseModelConfig(name="m", path="m", max_context_length=max_context_length, sampler=sampler)
        return _context_length(base, shape)

    assert served(None, num_gpus=1) == 131072
    assert served(8192, num_gpus=1) == 8192
    assert served(10**6, num_gpus=1) == 131072  # a cap, never more than the model takes


def test_on_cpu_the_samplers_kv_cache_still_caps_it(tmp_path: Path) -> None:
    """Qwen3-0.6B's KV cache: 28 layers x 8 key-value heads x head_dim 128, keys and values, 2 bytes each in bf16."""
    kv = {"num_hidden_layers": 28, "hidden_size": 1024, "num_attention_heads": 16, "num_key_value_heads": 8}
    shape = shape_of(tmp_path, QWEN3 | kv | {"head_dim": 128, "rope_scaling": YARN_4X})
    base = BaseModelConfig(name="m", path="m", trainer={"dtype": "bfloat16"}, sampler={"kv_cache_mib": 1024})
    assert _context_length(base, shape) == (1024 * 2**20 // (128 * 2 * 28 * 8 * 128 * 2) - 1) * 128 == 9216
