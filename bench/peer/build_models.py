# ruff: noqa
# fmt: off
# Copied unchanged from the team's shared peer notes (../shared/peers/build_models.py, beside skyrl-cpu.md); only these three lines added.
"""Build tiny, offline-loadable Qwen3 checkpoints (random weights) plus a locally trained
byte-level BPE tokenizer, for benchmarking Tinker-compatible servers on CPU.

Usage: python build_models.py [--out $PEER/models]
Produces <out>/tiny and <out>/small, each a HF folder (config.json, model.safetensors,
tokenizer.json, tokenizer_config.json, special_tokens_map.json, generation_config.json).
"""

import argparse
import json
import os
import random
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

VOCAB = 2048
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

VARIANTS = {
    "tiny": dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, intermediate_size=256),
    "small": dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1536),
}


def corpus(n_lines: int = 20000, seed: int = 0):
    """Deterministic synthetic English-ish text plus digits/punctuation so BPE learns merges."""
    rng = random.Random(seed)
    words = (
        "the of and to in is was for on that with as by at from it an be this are or which "
        "model train loss step token sample weight adapter rank learning rate gradient batch "
        "server client request future forward backward optimizer sequence prompt answer question "
        "alpha beta gamma delta one two three four five six seven eight nine ten hello world "
        "python jax torch tinker lora qwen layer head hidden vocab norm attention value key query"
    ).split()
    for _ in range(n_lines):
        k = rng.randint(4, 16)
        parts = []
        for _ in range(k):
            r = rng.random()
            if r < 0.8:
                w = rng.choice(words)
                parts.append(w.capitalize() if rng.random() < 0.1 else w)
            elif r < 0.9:
                parts.append(str(rng.randint(0, 9999)))
            else:
                parts.append(rng.choice([",", ".", "?", "!", ":", "(", ")", "-", "+", "="]))
        yield " ".join(parts) + rng.choice([".", "?", "!", ""]) + "\n"


def build_tokenizer(out: Path) -> PreTrainedTokenizerFast:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        min_frequency=2,
        special_tokens=SPECIALS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
        model_max_length=4096,
    )
    fast.save_pretrained(out)
    return fast


def build_model(name: str, out: Path, tok: PreTrainedTokenizerFast):
    spec = VARIANTS[name]
    eos = tok.convert_tokens_to_ids("<|endoftext|>")
    cfg = Qwen3Config(
        vocab_size=VOCAB,
        head_dim=spec["hidden_size"] // spec["num_attention_heads"],
        max_position_embeddings=4096,
        rms_norm_eps=1e-6,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
        **spec,
    )
    cfg.architectures = ["Qwen3ForCausalLM"]
    torch.manual_seed(0)
    model = Qwen3ForCausalLM(cfg).to(torch.float32).eval()
    model.config.dtype = "float32"
    model.save_pretrained(out, safe_serialization=True)
    n = sum(p.numel() for p in model.parameters())
    return n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.path.join(os.environ.get("PEER", "."), "models"))
    args = ap.parse_args()
    root = Path(args.out)
    summary = {}
    for name in VARIANTS:
        d = root / name
        d.mkdir(parents=True, exist_ok=True)
        tok = build_tokenizer(d)
        n = build_model(name, d, tok)
        # sanity: reload with the Auto classes, fully offline
        from transformers import AutoConfig, AutoTokenizer

        AutoConfig.from_pretrained(d, local_files_only=True)
        t2 = AutoTokenizer.from_pretrained(d, local_files_only=True)
        ids = t2("hello world, the model trains.")["input_ids"]
        summary[name] = {"path": str(d), "params": n, "len_tokenizer": len(t2), "eos_id": t2.eos_token_id, "example_ids": ids}
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
