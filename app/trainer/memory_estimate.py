"""About how much memory a forward(_backward) needs on a rank for its activations, from the base model's config.json
alone (no torch here): what a user whose operation kept killing the training workers is told it needs.

A rough model of a Llama-style decoder (Llama, Qwen, Mistral) as app.training.engine runs it, LoRA on a frozen base
with attention through PyTorch's scaled_dot_product_attention (no seq x seq matrix is kept). Per token:

- kept for the backward, per layer: the two norms' inputs and outputs (4 x hidden), the rotated queries and the
  attention output (2 x heads x head_dim), the rotated keys and the values (2 x kv_heads x head_dim), and the MLP's
  gate, up, activation and product (4 x intermediate); plus the final norm's input and output (2 x hidden). With
  activation checkpointing, each layer's input (hidden) instead, and one layer's activations at a time while the
  backward recomputes them. All in the model's dtype.
- the logits (vocab) in the model's dtype, and about six float32 buffers of their size while the log-softmax runs
  forward and backward (its float32 copy, the softmax, the gradients and their sum).

A forward alone (no backward) holds one layer's activations at a time, the logits and two float32 buffers.
Calibrated on the tiny test model in float32 on CPU (hidden 128, 2 layers, vocab 2048): a forward_backward's peak grew
by 74-78 KB per token against 73.7 KB estimated, a forward's by 24-31 KB against 32 KB. LoRA's rank-sized
intermediates, the eager attention kernel's heads x seq^2 scores, the weights, gradients and optimizer state, and the
allocator's slack are left out: it says how much to cut, not what a rank will hold.
"""

from __future__ import annotations

from typing import Any

_LOGIT_BUFFERS_FORWARD = 2  # float32 buffers the size of the logits: the float32 copy, the softmax
_LOGIT_BUFFERS_BACKWARD = 6  # and the gradients, their sum and the temporaries of the log-softmax's backward


def estimate_activation_bytes(
    config_json: dict[str, Any], tokens: int, dtype_bytes: int, checkpointing: bool, *, backward: bool = True
) -> int:
    """About the bytes of activations a rank holds at its peak running `tokens` tokens (padding included) through the
    model `config_json` describes (a multimodal model's `text_config`: its decoder), in a dtype of `dtype_bytes`,
    with or without activation checkpointing; `backward`: a forward_backward, else a forward."""
    text = config_json.get("text_config") or config_json
    hidden = int(text["hidden_size"])
    heads = int(text["num_attention_heads"])
    head_dim = int(text.get("head_dim") or hidden // heads)
    kv_heads = int(text.get("num_key_value_heads") or heads)
    one_layer = 4 * hidden + 2 * heads * head_dim + 2 * kv_heads * head_dim + 4 * int(text["intermediate_size"])
    layers = int(text["num_hidden_layers"])
    if not backward:
        kept, logit_buffers = one_layer, _LOGIT_BUFFERS_FORWARD
    elif checkpointing:
        kept, logit_buffers = layers * hidden + one_layer + 2 * hidden, _LOGIT_BUFFERS_BACKWARD
    else:
        kept, logit_buffers = layers * one_layer + 2 * hidden, _LOGIT_BUFFERS_BACKWARD
    per_token = kept * dtype_bytes + int(text["vocab_size"]) * (dtype_bytes + 4 * logit_buffers)
    return tokens * per_token
