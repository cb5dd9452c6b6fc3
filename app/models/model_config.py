"""A base model's `config.json`, read as JSON. Building the app needs two numbers from it; importing transformers
for them (and torch with it) cost seconds on the start-up path, in Serve's controller, before any replica starts."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class ModelShape:
    vocab_size: int
    max_position_embeddings: int


def model_shape(path: str) -> ModelShape:
    """The vocabulary size and context length of the model at `path`: a local directory, or a Hugging Face id
    resolved through the local cache (offline when HF_HUB_OFFLINE is set). Multimodal configs keep them under
    `text_config`."""
    local = Path(path)
    if local.is_dir():
        config_file = local / "config.json"
    else:
        from huggingface_hub import hf_hub_download

        config_file = Path(hf_hub_download(path, "config.json"))
    config = json.loads(config_file.read_text())
    text = config if "vocab_size" in config else config.get("text_config", {})
    try:
        return ModelShape(int(text["vocab_size"]), int(text["max_position_embeddings"]))
    except KeyError as exc:
        raise ValueError(f"{config_file} has no {exc.args[0]} (nor under text_config): is it a causal LM?") from None
