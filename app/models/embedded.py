"""Build the default model fully offline: a byte-level BPE tokenizer and a randomly initialised Qwen2.

Everything is generated from fixed word lists and a seeded RNG, so a build gives identical files on
every machine. Run as ``python -m app.models.embedded --preset tiny --out models/tiny``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from app.models import hub_cache

if TYPE_CHECKING:  # heavy imports stay lazy so `import app.models` is cheap
    from transformers import PreTrainedTokenizerFast

FORMAT_VERSION = 4  # 2: the final norm's gain (FINAL_NORM_GAIN); 3: vision presets' image tokens and processor; 4: and
# Qwen3.5's think tokens
# Random weights give near-uniform next-token distributions (entropy ~ln V) whose logits LoRA layers can
# barely move, since the unembedding is never adapted. Scaling the final norm's gain makes them peaked like a
# trained model's (entropy ~3.7 nats on tiny) so fine-tuning and RL visibly learn.
FINAL_NORM_GAIN = 8.0
# DeepSeek-V3's routers add a load-balancing bias to each expert's score when choosing experts (not when weighting
# them); initialised it is zero, which would leave that difference untested
ROUTER_BIAS_STD = 0.05
MARKER_FILE = "tinker_serve_model.json"
REQUIRED_FILES = ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json")
TOKENIZER_VOCAB_SIZE = 2048
PAD_TOKEN, IM_START, EOS_TOKEN = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
# A vision-language preset's tokenizer also carries Qwen-VL's image tokens, appended after the trained vocabulary (so
# its text token ids are the text presets'): the renderers wrap an image in start/end and the model sees `expected_tokens`
# image pads where the vision tower's embeddings go
VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD = "<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"
VISION_TOKENS = (VISION_START, VISION_END, IMAGE_PAD, VIDEO_PAD)
# after them, as single tokens: the cookbook's Qwen3.5 renderers parse a response by `</think>`'s one token id
THINK_TOKENS = ("<think>", "</think>")
PROCESSOR_FILES = ("preprocessor_config.json", "video_preprocessor_config.json")
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


@dataclass(frozen=True)
class Preset:
    """The shape of one embedded model: a Qwen2 (head_dim = hidden_size / num_attention_heads), a Qwen3, a Llama, a
    mixture of experts (Qwen3-MoE, gpt-oss), or one of the hybrid and latent-attention families; `moe` holds the
    expert fields (and any other family-specific ones) of its config class. A `vision` config makes the model
    vision-language as the family's real checkpoints are (Qwen3.5, Qwen3-VL): the text fields go under `text_config`,
    and a tiny random vision tower is saved beside the language model."""

    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    intermediate_size: int
    max_position_embeddings: int = 2048
    head_dim: int | None = None  # all but Qwen2
    architecture: Literal[
        "qwen2", "qwen3", "llama", "qwen3_moe", "gpt_oss", "qwen3_5", "qwen3_5_moe", "nemotron_h", "deepseek_v3",
        "glm4_moe", "olmo3", "qwen3_vl"
    ] = "qwen2"
    dtype: Literal["float32", "bfloat16"] = "float32"  # of the weights on disk
    moe: dict[str, object] = field(default_factory=dict)
    vision: dict[str, object] | None = None

    def config_fields(self) -> dict[str, object]:
        """The fields the architecture's config class takes (its text config's, for a vision-language model)."""
        fields = asdict(self)
        for name in ("architecture", "dtype", "moe", "vision", *(("head_dim",) if self.head_dim is None else ())):
            fields.pop(name)
        return fields | self.moe


def _tiny(**shape: Any) -> Preset:
    """The tiny model's size (0.56M parameters with this vocabulary), of any architecture."""
    return Preset(hidden_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **shape)


# Qwen3.5's layers: Gated DeltaNet (linear attention) then full attention, as 3:1 in the real models
_GATED_DELTANET: dict[str, object] = {
    "layer_types": ["linear_attention", "full_attention"], "linear_num_key_heads": 2, "linear_num_value_heads": 4,
    "linear_key_head_dim": 32, "linear_value_head_dim": 32}
# Qwen3.5's vision tower, as small as its config allows (frozen: LoRA adapts the language model), with its patch size
_TINY_VISION: dict[str, object] = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2,
                                   "out_hidden_size": 128, "num_position_embeddings": 64, "patch_size": 16,
                                   "spatial_merge_size": 2, "temporal_patch_size": 2}
# Its image processor's resize bounds (Qwen-VL's smart resize to multiples of patch x merge = 32 pixels): 1 to 16 image
# tokens an image, so tests stay small; the real models' are 65,536 to 16.8M pixels
_TINY_IMAGE_PIXELS = {"shortest_edge": 32 * 32, "longest_edge": 128 * 128}
# Multimodal rotary positions (time, height, width) over the tiny heads' 4 rotary frequencies (head_dim 32 x 0.25), as
# the real models' [11, 11, 10] interleaved over 32
_TINY_MROPE: dict[str, object] = {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.25,
                                  "mrope_section": [2, 1, 1], "mrope_interleaved": True}
# Qwen3-VL's: Qwen3 text layers with full-width interleaved multimodal rotary positions (the real models' [24, 20, 20]
# over 64 frequencies, scaled to the tiny heads' 16), and a tower whose DeepStack mergers feed each of its layers'
# features to the language model's first layers (the real models': blocks 5, 11, 17 of 24 into layers 0, 1, 2)
_TINY_QWEN3_VL_MROPE: dict[str, object] = {"rope_type": "default", "rope_theta": 5000000.0, "mrope_section": [6, 5, 5],
                                           "mrope_interleaved": True}
_TINY_DEEPSTACK_VISION = _TINY_VISION | {"depth": 2, "deepstack_visual_indexes": [0, 1]}
# DeepSeek-V3 and GLM-4.5: a dense first layer, then 8 routed experts (2 a token) and a shared one, one expert group
_ROUTED_MOE: dict[str, object] = {
    "first_k_dense_replace": 1, "n_routed_experts": 8, "num_experts_per_tok": 2, "n_shared_experts": 1,
    "moe_intermediate_size": 64, "n_group": 1, "topk_group": 1}

PresetName = Literal[
    "tiny", "small", "qwen3-0.6b", "tiny-qwen3", "tiny-llama", "tiny-qwen3-moe", "tiny-gpt-oss", "tiny-qwen3_5",
    "tiny-qwen3_5-moe", "tiny-nemotron-h", "tiny-deepseek-v3", "tiny-glm4-moe", "tiny-qwen3-vl",
]  # PRESETS' keys, named for the config's `embedded_preset` (tests/unit/models/test_embedded_model.py: the same)

PRESETS: dict[str, Preset] = {
    "tiny": _tiny(intermediate_size=256),
    # (a long context: the sequence-parallel benchmark trains it at 65,536 tokens through the server)
    "small": Preset(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                    intermediate_size=1536, max_position_embeddings=131072),
    # Qwen3-0.6B's shape with this tokenizer's vocabulary (0.44B parameters, 0.9 GB): a realistic size for benchmarks
    "qwen3-0.6b": Preset(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                         intermediate_size=3072, max_position_embeddings=40960, head_dim=128, architecture="qwen3",
                         dtype="bfloat16"),
    # the tiny shape in the other supported families (app.models.families): 8 experts, 2 per token for the MoEs
    "tiny-qwen3": _tiny(intermediate_size=256, head_dim=32, architecture="qwen3"),
    "tiny-llama": _tiny(intermediate_size=256, head_dim=32, architecture="llama"),
    "tiny-qwen3-moe": _tiny(intermediate_size=256, head_dim=32, architecture="qwen3_moe",
                            moe={"num_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 64}),
    "tiny-gpt-oss": _tiny(intermediate_size=64, head_dim=32, architecture="gpt_oss",
                          moe={"num_local_experts": 8, "num_experts_per_tok": 2, "sliding_window": 128,
                               "layer_types": ["sliding_attention", "full_attention"]}),
    "tiny-qwen3-vl": _tiny(intermediate_size=256, head_dim=32, architecture="qwen3_vl",
                           moe={"rope_parameters": _TINY_QWEN3_VL_MROPE}, vision=_TINY_DEEPSTACK_VISION),
    # the lineup's hybrids and latent-attention MoEs (app.models.families), two to four layers of each kind they mix
    "tiny-qwen3_5": _tiny(intermediate_size=256, head_dim=32, architecture="qwen3_5",
                          moe=_GATED_DELTANET | {"rope_parameters": _TINY_MROPE}, vision=_TINY_VISION),
    "tiny-qwen3_5-moe": _tiny(intermediate_size=256, head_dim=32, architecture="qwen3_5_moe", vision=_TINY_VISION,
                              moe=_GATED_DELTANET | {"rope_parameters": _TINY_MROPE} | {"num_experts": 8, "num_experts_per_tok": 2,
                                                     "moe_intermediate_size": 64,
                                                     "shared_expert_intermediate_size": 64}),
    "tiny-nemotron-h": _tiny(intermediate_size=256, head_dim=32, architecture="nemotron_h", moe={
        "layers_block_type": ["mamba", "moe", "attention", "mlp"], "mamba_num_heads": 8, "mamba_head_dim": 32,
        "n_groups": 1, "ssm_state_size": 16, "chunk_size": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
        "moe_intermediate_size": 64, "moe_shared_expert_intermediate_size": 64,
        "tie_word_embeddings": False}),  # Nemotron-H never ties its LM head (transformers' and vLLM's models alike)
    # as DeepSeek-V3's and Kimi K2's config.json: sigmoid router scores with a correction bias (`noaux_tc`, what
    # transformers' DeepseekV3 always computes; vLLM builds the bias only for that topk_method and scores with softmax
    # without `scoring_func`), experts chosen within the best groups, and an LM head of its own (vLLM ties none)
    "tiny-deepseek-v3": _tiny(intermediate_size=256, architecture="deepseek_v3", moe=_ROUTED_MOE | {
        "num_key_value_heads": 4,  # latent attention: one latent for every head
        # the real models' latent, 512 wide plus 64 of rotary key: vLLM's MLA takes no other (its CPU decode kernel)
        "q_lora_rank": 64, "kv_lora_rank": 512, "qk_rope_head_dim": 64, "qk_nope_head_dim": 32, "v_head_dim": 32,
        "num_nextn_predict_layers": 0, "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc",
        "scoring_func": "sigmoid", "tie_word_embeddings": False,
        # YaRN as theirs (a 4x context): vLLM's CPU build runs its DeepSeek YaRN rotary in torch, but its default
        # rotary kernel misplaces the rotary halves of MLA's [tokens, heads, 64] queries
        "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                            "original_max_position_embeddings": 512, "beta_fast": 32.0, "beta_slow": 1.0,
                            "mscale": 1.0, "mscale_all_dim": 1.0}}),
    # an LM head of its own, as GLM-4.5's (vLLM's Glm4MoeForCausalLM never ties it to the embedding)
    "tiny-glm4-moe": _tiny(intermediate_size=256, head_dim=32, architecture="glm4_moe",
                           moe=_ROUTED_MOE | {"num_nextn_predict_layers": 0, "tie_word_embeddings": False}),
}

_NOUNS = """cat dog bird fish horse farmer teacher student doctor child friend mother father sister brother
king queen robot writer painter baker driver pilot sailor player city town village river lake sea mountain
hill forest garden park road street bridge house school library kitchen window door table chair book letter
paper story song picture map box bag ball cup bottle plate bread apple orange water tea coffee milk cheese
soup cake dinner morning evening night day week month year winter summer sun moon star cloud rain snow wind
fire stone tree flower field island world market shop office computer phone machine number answer question
problem idea word sentence language music game team family animal boat ship train plane car""".split()
_ADJECTIVES = """red green blue black white small big long short tall old new young warm cold bright dark
quiet loud happy sad quick slow easy hard simple kind clever brave gentle busy clean heavy light soft sweet
fresh early late rich wide deep curious friendly lucky tired hungry""".split()
_VERBS = """walk talk play work open close paint clean climb cook count follow help jump learn listen look
love move need plan pull push reach start visit want wash watch wait answer carry finish travel return
explain remember discover collect""".split()
_PLACES = ["in the park", "at home", "near the lake", "on the hill", "after school", "every morning",
           "in the city", "under the tree", "before dinner", "at night", "by the sea", "with great care"]
_SYLLABLES = "ka ri to me lo sa an bel dor fin gar hel jon kel mar nor pel quin ros tal ven wil zor".split()
_CHAT_LINES = ["system: You are a helpful assistant.", "user: Please answer the question.",
               "assistant: Sure, here is the answer.", "user: Thank you!", "assistant: You are welcome."]


def _suffix(word: str, suffix: str) -> str:
    """Attach s/ed/ing/er/est with the common English spelling rules (good enough for the lists above)."""
    if suffix == "s":
        if word.endswith(("sh", "ch", "s", "x")):
            return word + "es"
        return word[:-1] + "ies" if word.endswith("y") and word[-2] not in "aeiou" else word + "s"
    if word.endswith("y") and word[-2] not in "aeiou" and suffix != "ing":
        word = word[:-1] + "i"
    return (word[:-1] if word.endswith("e") else word) + suffix


def training_corpus(seed: int = 0) -> list[str]:
    """Deterministic tokenizer text: arithmetic Q/A, simple English sentences, made-up names, ChatML roles."""
    rng = random.Random(seed)
    lines = []
    for _ in range(3000):
        a, b, op = rng.randint(0, 999), rng.randint(0, 999), rng.choice("+-*")
        c = a + b if op == "+" else a - b if op == "-" else a * b
        lines.append(f"What is {a} {op} {b}? The answer is {c}.")
    verbs = _VERBS + [_suffix(v, sfx) for v in _VERBS for sfx in ("s", "ed", "ing")]
    adjectives = _ADJECTIVES * 2 + [_suffix(a, sfx) for a in _ADJECTIVES for sfx in ("er", "est")]
    for _ in range(3000):
        subject = f"{rng.choice(['the', 'a', 'my', 'our'])} {rng.choice(adjectives)} {rng.choice(_NOUNS)}"
        obj = f"{rng.choice(['the', 'some', 'two', 'many'])} {rng.choice(adjectives)} {_suffix(rng.choice(_NOUNS), 's')}"
        sentence = f"{subject} {rng.choice(verbs)} {obj} {rng.choice(_PLACES)}{rng.choice('.!?')}"
        lines.append(sentence[0].upper() + sentence[1:])
    for _ in range(1500):
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 4))).capitalize()
        lines.append(f"{name} {rng.choice(verbs)} the {rng.choice(_NOUNS)}.")
    lines.extend(_CHAT_LINES * 20)
    return lines


def build_tokenizer(seed: int = 0) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE (vocab 2048) on `training_corpus` and wrap it for transformers."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    # Same pipeline Qwen2Tokenizer rebuilds on load (AutoTokenizer and vLLM pick that class for
    # model_type "qwen2"), so tokenizer.json, PreTrainedTokenizerFast and AutoTokenizer agree on ids.
    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=TOKENIZER_VOCAB_SIZE, special_tokens=[PAD_TOKEN, IM_START, EOS_TOKEN],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(training_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS_TOKEN, pad_token=PAD_TOKEN, model_max_length=2048,
                                   additional_special_tokens=[IM_START], chat_template=CHAT_TEMPLATE)


def _marker(preset: str, seed: int) -> dict[str, object]:
    return {"format_version": FORMAT_VERSION, "preset": preset, "seed": seed}


def is_complete(out_dir: Path, preset: str, seed: int = 0) -> bool:
    """True when `out_dir` holds a finished build whose marker matches preset, seed and format."""
    try:
        marker = json.loads((out_dir / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    matches = all(marker.get(k) == v for k, v in _marker(preset, seed).items())
    return matches and all((out_dir / name).is_file() for name in REQUIRED_FILES)


def _fix_permissions(path: Path) -> None:
    """mkdtemp makes 0700 dirs (and some writers 0600 files): give the tree the usual umask modes."""
    umask = os.umask(0)
    os.umask(umask)
    for item in [path, *path.rglob("*")]:
        item.chmod((0o777 if item.is_dir() else 0o666) & ~umask)


def _write_model(preset: str, seed: int, out: Path) -> dict[str, object]:
    """Write tokenizer, config and random weights into `out`; return the marker contents."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForImageTextToText, GenerationConfig

    shape = PRESETS[preset]
    tokenizer = build_tokenizer(seed)
    if shape.vision is not None:
        tokenizer.add_special_tokens({"additional_special_tokens": [IM_START, *VISION_TOKENS, *THINK_TOKENS]})
        _write_processor(out, shape.vision)
    tokenizer.save_pretrained(out)
    eos_id, pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
    text = {"vocab_size": len(tokenizer), "tie_word_embeddings": True, "bos_token_id": pad_id, "eos_token_id": eos_id,
            "pad_token_id": pad_id, **shape.config_fields()}
    if shape.vision is None:
        config = AutoConfig.for_model(shape.architecture, dtype=shape.dtype, **text)
        model_class: Any = AutoModelForCausalLM
    else:  # the real checkpoints' layout: a language model and a vision tower (AutoModelForCausalLM loads the former)
        token_ids = dict(zip(("vision_start_token_id", "vision_end_token_id", "image_token_id", "video_token_id"),
                             [tokenizer.convert_tokens_to_ids(t) for t in VISION_TOKENS], strict=True))
        config = AutoConfig.for_model(shape.architecture, dtype=shape.dtype, text_config=text,
                                      vision_config=shape.vision, tie_word_embeddings=True, **token_ids)
        model_class = AutoModelForImageTextToText
    torch.manual_seed(seed)
    model = model_class.from_config(config).to(getattr(torch, shape.dtype)).eval()
    with torch.no_grad():
        gain = _final_norm(model).weight
        if gain.any():
            gain.mul_(FINAL_NORM_GAIN)
        else:  # a zero-centred norm (Qwen3.5's scales by 1 + weight, initialised to 0)
            gain.fill_(FINAL_NORM_GAIN - 1)
        if getattr(config, "topk_method", None) == "noaux_tc":  # a trained router's expert bias, not its zeros
            for name, buffer in model.named_buffers():
                if name.endswith("e_score_correction_bias"):
                    buffer.normal_(std=ROUTER_BIAS_STD)
    model.generation_config = GenerationConfig(bos_token_id=pad_id, eos_token_id=eos_id, pad_token_id=pad_id)
    model.save_pretrained(out, safe_serialization=True)
    marker = _marker(preset, seed) | {
        "vocab_size": len(tokenizer), "num_parameters": sum(p.numel() for p in model.parameters()),
        "eos_token_id": eos_id, "pad_token_id": pad_id, "im_start_token_id": tokenizer.convert_tokens_to_ids(IM_START),
    }
    (out / MARKER_FILE).write_text(json.dumps(marker, indent=2, sort_keys=True) + "\n")
    return marker


def _write_processor(out: Path, vision: dict[str, object]) -> None:
    """Qwen-VL's processor files for the tiny vision tower, as the real checkpoints carry them: what AutoProcessor,
    AutoImageProcessor (the cookbook's get_image_processor) and vLLM read from the model folder. Written as JSON:
    the video processor's class needs torchvision, which the image side does not."""
    common = {"patch_size": vision["patch_size"], "merge_size": vision["spatial_merge_size"],
              "temporal_patch_size": vision["temporal_patch_size"], "image_mean": [0.5] * 3, "image_std": [0.5] * 3,
              "size": _TINY_IMAGE_PIXELS, "processor_class": "Qwen3VLProcessor"}
    files = {PROCESSOR_FILES[0]: common | {"image_processor_type": "Qwen2VLImageProcessor"},
             PROCESSOR_FILES[1]: common | {"video_processor_type": "Qwen3VLVideoProcessor"}}
    for name, contents in files.items():
        (out / name).write_text(json.dumps(contents, indent=2, sort_keys=True) + "\n")


def _final_norm(model: Any) -> Any:
    """The language model's last norm, before the LM head (`norm`, or Nemotron-H's `norm_f`)."""
    decoder = model.get_decoder()
    return getattr(decoder, "norm", None) or decoder.norm_f


def build_embedded_model(preset: str, out_dir: Path, seed: int = 0) -> Path:
    """Build `preset` into `out_dir` atomically; a no-op when a matching build is already there.

    A directory that exists but carries no marker of ours is never overwritten (FileExistsError).
    """
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
    out_dir = Path(out_dir).resolve()
    if is_complete(out_dir, preset, seed):
        return out_dir
    if out_dir.exists() and any(out_dir.iterdir()) and not (out_dir / MARKER_FILE).exists():
        raise FileExistsError(f"{out_dir} exists and is not an embedded-model build; refusing to replace it")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.build-", dir=out_dir.parent))
    try:
        _write_model(preset, seed, tmp)
        _fix_permissions(tmp)
        if out_dir.exists():  # an empty dir or an older/mismatched build of ours: move it aside first
            if is_complete(out_dir, preset, seed):  # a concurrent builder finished first
                return out_dir
            old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
            os.replace(out_dir, old / "model")
            shutil.rmtree(old, ignore_errors=True)
        try:
            os.replace(tmp, out_dir)
        except OSError:
            if not is_complete(out_dir, preset, seed):  # lost a race to a different request
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out_dir


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: build one preset and print what happened."""
    parser = argparse.ArgumentParser(description="Build the offline embedded model (tokenizer + random weights).")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="tiny")
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--register-as", metavar="ORG/NAME",
                        help="also make this name resolve to the model's tokenizer and config offline (Hugging Face "
                             "cache), as the server does for the names it serves")
    args = parser.parse_args(argv)
    already = is_complete(args.out.resolve(), args.preset, args.seed)
    start = time.perf_counter()
    path = build_embedded_model(args.preset, args.out, args.seed)
    elapsed = time.perf_counter() - start
    marker = json.loads((path / MARKER_FILE).read_text())
    verb = "already present" if already else "built"
    print(f"{verb}: preset={args.preset} seed={args.seed} at {path} in {elapsed:.2f}s "
          f"(params={marker['num_parameters']:,}, vocab={marker['vocab_size']}, "
          f"eos={marker['eos_token_id']}, pad={marker['pad_token_id']}, im_start={marker['im_start_token_id']})")
    if args.register_as:
        print(f"registered as {args.register_as}: {hub_cache.register(args.register_as, path)}")


if __name__ == "__main__":
    main()
