"""The files of an uploaded adapter, in the format save_weights_external exports (a PEFT adapter directory), checked
without running anything they hold: adapter_config.json as JSON, adapter_model.safetensors by its header alone (never
torch.load, never pickle)."""

from __future__ import annotations

import json
import struct
from typing import Any

from app.errors import UserError

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
DTYPE_BYTES = {"F32": 4, "BF16": 2, "F16": 2}  # what an adapter may be stored in
_OFF: tuple[object, ...] = (None, False, {}, [])  # what PEFT writes for an option that is off


def max_sizes(tensors: dict[str, tuple[int, int]], max_config_bytes: int, max_header_bytes: int) -> dict[str, int]:
    """The most bytes each file may hold: the config's limit; the weights in float32 behind the largest header."""
    values = sum(a * b for a, b in tensors.values())
    return {CONFIG_FILE: max_config_bytes, WEIGHTS_FILE: 8 + max_header_bytes + 4 * values}


def check_config(raw: bytes, rank: int, targets: list[str]) -> float:
    """The adapter's lora_alpha, once its adapter_config.json is a plain LoRA of `rank` on exactly `targets`."""
    field = f"files.{CONFIG_FILE}"
    try:
        config: Any = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise UserError(f"{CONFIG_FILE} is not JSON", field=field) from None
    if not isinstance(config, dict) or config.get("peft_type") != "LORA":
        raise UserError(f"{CONFIG_FILE} must be a PEFT LoRA config (peft_type LORA)", field=field)
    if config.get("r") != rank:
        raise UserError(f"{CONFIG_FILE} has r={config.get('r')!r}; the upload declared rank {rank}", field=f"{field}.r")
    modules = config.get("target_modules")
    if not isinstance(modules, list) or sorted(modules) != sorted(targets):
        raise UserError(
            f"{CONFIG_FILE} targets {modules!r}; lora_config's train_attn/train_mlp adapt exactly {targets}",
            field=f"{field}.target_modules",
        )
    for option in ("use_dora", "use_rslora", "modules_to_save", "layers_to_transform", "rank_pattern", "alpha_pattern"):
        if config.get(option) not in _OFF:
            raise UserError(f"{CONFIG_FILE} sets {option}: only plain LoRA is served", field=f"{field}.{option}")
    if config.get("bias", "none") != "none":
        raise UserError(f"{CONFIG_FILE} trains biases (bias={config['bias']!r})", field=f"{field}.bias")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1e6:
        raise UserError(f"{CONFIG_FILE} has lora_alpha={alpha!r}; send a positive number", field=f"{field}.lora_alpha")
    return float(alpha)


def header_length(prefix: bytes, size: int, max_header_bytes: int) -> int:
    """The length of the safetensors header that the file's first 8 bytes announce."""
    field = f"files.{WEIGHTS_FILE}"
    if len(prefix) < 8:
        raise UserError(f"{WEIGHTS_FILE} is not a safetensors file (it holds {size} bytes)", field=field)
    (length,) = struct.unpack("<Q", prefix[:8])
    if length > max_header_bytes or 8 + length > size:
        raise UserError(
            f"{WEIGHTS_FILE} is not a safetensors file: its first 8 bytes announce a {length}-byte header "
            f"(uploads.max_header_bytes={max_header_bytes}, file {size} bytes); pickled (.bin) weights are refused",
            field=field,
        )
    return int(length)


def check_header(header: bytes, size: int, tensors: dict[str, tuple[int, int]]) -> None:
    """That the safetensors header lists exactly `tensors`, each of its shape in an allowed dtype, laid end to end
    over the rest of a file of `size` bytes."""
    field = f"files.{WEIGHTS_FILE}"
    try:
        entries: Any = json.loads(header)
    except (UnicodeDecodeError, ValueError):
        raise UserError(f"{WEIGHTS_FILE} has a header that is not JSON: not a safetensors file", field=field) from None
    if not isinstance(entries, dict):
        raise UserError(f"{WEIGHTS_FILE}'s header is not a JSON object", field=field)
    entries.pop("__metadata__", None)
    missing, extra = sorted(set(tensors) - set(entries)), sorted(set(entries) - set(tensors))
    if missing or extra:
        raise UserError(
            f"{WEIGHTS_FILE} does not fit the base model and lora_config: missing {missing[:3]} "
            f"({len(missing)} in all), unexpected {extra[:3]} ({len(extra)} in all)",
            field=field,
        )
    spans = []
    for name, entry in entries.items():
        entry = entry if isinstance(entry, dict) else {}
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
        if dtype not in DTYPE_BYTES:
            raise UserError(f"{name} is {dtype}; adapters may be {sorted(DTYPE_BYTES)}", field=field)
        if shape != list(tensors[name]):
            raise UserError(f"{name} has shape {shape}; this base and rank need {list(tensors[name])}", field=field)
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(type(o) is int for o in offsets)):
            raise UserError(f"{name} has malformed data_offsets {offsets!r}", field=field)
        if offsets[1] - offsets[0] != shape[0] * shape[1] * DTYPE_BYTES[dtype]:
            raise UserError(f"{name}'s data_offsets {offsets} do not hold its {dtype} {shape}", field=field)
        spans.append((offsets[0], offsets[1]))
    end = 0
    for start, stop in sorted(spans):
        if start != end:
            raise UserError(f"{WEIGHTS_FILE}'s tensors overlap or leave gaps", field=field)
        end = stop
    if 8 + len(header) + end != size:
        raise UserError(f"{WEIGHTS_FILE} holds {size} bytes; its header describes {8 + len(header) + end}", field=field)
