"""A base model's `config.json`, read as JSON. Building the app needs a few numbers from it; importing transformers
for them (and torch with it) cost seconds on the start-up path, in Serve's controller, before any replica starts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.models.families import ALIASES

if TYPE_CHECKING:
    from transformers import PretrainedConfig


# vLLM's KV cache block on CPU (0.32: vllm/platforms/cpu.py; 16 for MLA, whose blocks this over-counts, never under)
VLLM_CPU_BLOCK_TOKENS = 128
# RoPE scalings that stretch the positions a model was trained on by their `factor`. Llama 3's and LongRoPE's are not
# among them: their configs' max_position_embeddings is the scaled context already.
_STRETCHING_ROPE = ("yarn", "dynamic", "linear")


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    max_position_embeddings: int
    kv_values_per_token: int | None = None  # keys and values a token keeps in a KV cache (None: not given)
    model_type: str = ""  # its family (app.models.families)
    scaled_positions: int | None = None  # what its RoPE scaling gives, when more than max_position_embeddings

    @property
    def context_length(self) -> int:
        """The tokens the model takes: max_position_embeddings, or what its RoPE scaling gives."""
        return self.scaled_positions or self.max_position_embeddings

    def kv_cache_tokens(self, cache_bytes: int, dtype_bytes: int) -> int | None:
        """The longest sequence vLLM's CPU engine can hold in a KV cache of `cache_bytes` for this model in a dtype of
        `dtype_bytes`: its whole blocks of VLLM_CPU_BLOCK_TOKENS tokens, less the one its block pool keeps back (vLLM
        0.32's check_enough_kv_cache_memory; a max_model_len one token over it stops the engine from starting)."""
        if not self.kv_values_per_token:
            return None
        blocks = cache_bytes // (VLLM_CPU_BLOCK_TOKENS * self.kv_values_per_token * dtype_bytes) - 1
        return max(0, blocks) * VLLM_CPU_BLOCK_TOKENS


def read_model_config(path: str) -> dict[str, Any] | None:
    """The config.json of the base model at `path` (a local directory, or a Hugging Face id already in the local
    cache: nothing is downloaded); None when there is none to read."""
    try:
        if Path(path).is_dir():
            local = Path(path) / "config.json"
        else:
            from huggingface_hub import try_to_load_from_cache

            cached = try_to_load_from_cache(path, "config.json")
            if not isinstance(cached, str):
                return None
            local = Path(cached)
        config: dict[str, Any] = json.loads(local.read_text())
    except (OSError, ValueError):  # no file, no JSON, or not a hub id (HFValidationError is a ValueError)
        return None
    return config


def model_shape(path: str) -> ModelShape:
    """The vocabulary size, context length (with its RoPE scaling), KV cache width and family of the model at `path`:
    a local directory, or a Hugging Face id resolved through the local cache (offline when HF_HUB_OFFLINE is set).
    Multimodal configs keep them under `text_config`."""
    local = Path(path)
    if local.is_dir():
        config_file = local / "config.json"
    else:
        from huggingface_hub import hf_hub_download

        config_file = Path(hf_hub_download(path, "config.json"))
    config = json.loads(config_file.read_text())
    text = config if "vocab_size" in config else config.get("text_config", {})
    try:
        return ModelShape(
            int(text["vocab_size"]),
            int(text["max_position_embeddings"]),
            _kv_values_per_token(text),
            str(config.get("model_type", "")),
            _scaled_positions(text),
        )
    except KeyError as exc:
        raise ValueError(f"{config_file} has no {exc.args[0]} (nor under text_config): is it a causal LM?") from None


def _scaled_positions(text: dict) -> int | None:
    """The context a yarn, dynamic or linear RoPE scaling gives (`rope_scaling`, or transformers 5's `rope_parameters`,
    one dict or one per layer type): `factor` x the positions it was trained on (original_max_position_embeddings,
    else max_position_embeddings), when that is more than max_position_embeddings."""
    rope = text.get("rope_scaling") or text.get("rope_parameters") or {}
    positions = int(text["max_position_embeddings"])
    scaled = positions
    for params in [v for v in rope.values() if isinstance(v, dict)] or [rope]:
        if (params.get("rope_type") or params.get("type")) in _STRETCHING_ROPE and params.get("factor"):
            trained = params.get("original_max_position_embeddings") or text.get("original_max_position_embeddings")
            scaled = max(scaled, int(float(params["factor"]) * int(trained or positions)))
    return scaled if scaled > positions else None


def _kv_values_per_token(text: dict) -> int | None:
    """2 x layers x key-value heads x head dim, for the decoders whose config names them (Llama, Qwen, Mistral...)."""
    try:
        heads = int(text["num_attention_heads"])
        head_dim = int(text.get("head_dim") or int(text["hidden_size"]) // heads)
        return 2 * int(text["num_hidden_layers"]) * int(text.get("num_key_value_heads") or heads) * head_dim
    except (KeyError, TypeError, ValueError):
        return None


def transformers_config(path: str) -> PretrainedConfig:
    """The model's config as transformers reads it; a `model_type` transformers has no class for but a family names
    (Kimi K2's `kimi_k2`) is read with that family's class, without the checkpoint's remote code."""
    from transformers import AutoConfig, PretrainedConfig
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    model_type = model_shape(path).model_type
    if model_type in CONFIG_MAPPING or model_type not in ALIASES:
        return AutoConfig.from_pretrained(path)
    fields, _ = PretrainedConfig.get_config_dict(path)
    for name in ("model_type", "auto_map"):
        fields.pop(name, None)
    return AutoConfig.for_model(ALIASES[model_type], **fields)
