"""The activation memory estimate from a config.json: its calibration point (the tiny model, measured), how
checkpointing, a forward alone and the dtype change it, and reading config.json where a base model lives."""

from __future__ import annotations

import json
from pathlib import Path

from app.models.model_config import read_model_config
from app.trainer.memory_estimate import estimate_activation_bytes
from tests.conftest import TINY_MODEL

LLAMA_8B = {  # Llama-3-8B's config.json, the keys the estimate reads
    "hidden_size": 4096,
    "num_hidden_layers": 32,
    "intermediate_size": 14336,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "vocab_size": 128256,
}


def test_the_tiny_model_estimate_is_what_was_measured() -> None:
    """float32 on CPU, 4-12k tokens: the peak grew by 74-78 KB per token (forward_backward), 24-31 KB (forward)."""
    config = json.loads((TINY_MODEL / "config.json").read_text())
    assert estimate_activation_bytes(config, 1000, 4, False) == 73_728_000
    assert estimate_activation_bytes(config, 1000, 4, False, backward=False) == 32_256_000


def test_checkpointing_a_forward_alone_and_a_narrower_dtype_need_less() -> None:
    full = estimate_activation_bytes(LLAMA_8B, 8192, 2, False)
    checkpointed = estimate_activation_bytes(LLAMA_8B, 8192, 2, True)
    forward = estimate_activation_bytes(LLAMA_8B, 8192, 2, False, backward=False)
    assert forward < checkpointed < full < estimate_activation_bytes(LLAMA_8B, 8192, 4, False)
    # layers: 32 x (4 x 4096 + 2 x 4096 + 2 x 1024 + 4 x 14336) + 2 x 4096 elements in bfloat16; logits: 26 bytes each
    assert full == 8192 * ((32 * 83968 + 8192) * 2 + 128256 * 26)
    assert estimate_activation_bytes(LLAMA_8B, 16384, 2, False) == 2 * full  # linear in the tokens
    assert estimate_activation_bytes({"text_config": LLAMA_8B}, 8192, 2, False) == full  # a multimodal config


def test_config_json_is_read_from_the_model_directory(tmp_path: Path) -> None:
    config = read_model_config(str(TINY_MODEL))
    assert config is not None and config["hidden_size"] == 128
    assert read_model_config(str(tmp_path)) is None  # a directory without one
    assert read_model_config("no-such-org/no-such-model") is None  # a hub id not in the local cache
