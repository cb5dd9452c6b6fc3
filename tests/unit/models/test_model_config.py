"""model_shape reads what the builder needs from config.json (sizes and the model family), as transformers would."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import AutoConfig

from app.models.model_config import ModelShape, model_shape
from tests.conftest import TINY_MODEL


def test_embedded_model_shape_matches_transformers() -> None:
    if not (TINY_MODEL / "config.json").exists():
        pytest.fail("models/tiny is missing: run `make model` first", pytrace=False)
    hf = AutoConfig.from_pretrained(TINY_MODEL)
    kv = 2 * hf.num_hidden_layers * hf.num_key_value_heads * (hf.hidden_size // hf.num_attention_heads)
    assert model_shape(str(TINY_MODEL)) == ModelShape(hf.vocab_size, hf.max_position_embeddings, kv, hf.model_type)


def test_how_many_tokens_a_kv_cache_holds(tmp_path: Path) -> None:
    """Qwen3-0.6B's shape: 28 layers x 8 key-value heads x head_dim 128 x keys and values, 2 bytes each in bf16."""
    config = {"vocab_size": 2048, "max_position_embeddings": 40960, "num_hidden_layers": 28, "hidden_size": 1024,
              "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 128}  # fmt: skip
    (tmp_path / "config.json").write_text(json.dumps(config))
    shape = model_shape(str(tmp_path))
    assert shape.kv_values_per_token == 2 * 28 * 8 * 128
    # whole blocks of 128 tokens (14 MiB each here), less the one vLLM's block pool keeps back: 18 - 1 of them
    assert shape.kv_cache_tokens(256 * 2**20, 2) == (256 * 2**20 // (128 * 57344 * 2) - 1) * 128 == 2176
    # the Sampler that never started: vLLM needed 2.01 GiB of the 2,048 MiB for 18,724 tokens
    assert shape.kv_cache_tokens(2048 * 2**20, 2) == 145 * 128 == 18560
    assert shape.kv_cache_tokens(128 * 57344 * 2, 2) == 0  # one block is the one kept back


def test_multimodal_configs_keep_them_under_text_config(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"vocab_size": 7, "max_position_embeddings": 9}}))
    assert model_shape(str(tmp_path)) == ModelShape(7, 9)


def test_a_config_without_them_names_the_missing_key(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"vocab_size": 7}))
    with pytest.raises(ValueError, match="max_position_embeddings"):
        model_shape(str(tmp_path))
