"""vLLM's Qwen3.5 and Qwen3.5-MoE vision-language models as the Sampler serves them: text, with our adapters (a vLLM
general plugin, loaded in the Sampler's processes).

Qwen3.5 checkpoints are vision-language models (`Qwen3_5ForConditionalGeneration`); the Sampler starts vLLM with
`language_model_only` (app.models.families), so the vision tower is neither built nor asked for its processor. Two
things still stood in the way:

- vLLM's model code imports `smart_resize` from transformers' torchvision image processor module, which imports
  torchvision first. The CPU install has none (PyPI's wheels are CUDA builds that do not load on a CPU torch), so every
  Qwen3.5 architecture failed vLLM's model inspection. Without torchvision that module name is given the PIL image
  processor's module, whose `smart_resize` is the same function.
- The trainer loads the language model alone (AutoModelForCausalLM: `Qwen3_5ForCausalLM`), so adapters name its layers
  `model.layers.N...`; vLLM maps a checkpoint's `model.language_model.` onto its `language_model.model.` and left ours
  unmatched, and an adapter unmatched is silently not applied. The models' name mapping (which vLLM also applies to
  LoRA weights) here maps `model.layers.` there too; the checkpoints' own weights never start with it.
"""

from __future__ import annotations

import importlib
import importlib.util
import logging
import sys

logger = logging.getLogger("tinker_serve.sampler")
_VLLM_SERIES = "0.32."  # vLLM 0.32's Qwen3.5 classes and their name mapping
_TORCHVISION_MODULE = "transformers.models.qwen2_vl.image_processing_qwen2_vl"
_PIL_MODULE = "transformers.models.qwen2_vl.image_processing_pil_qwen2_vl"
TRAINER_PREFIX, VLLM_PREFIX = "model.layers.", "language_model.model.layers."


def install() -> None:
    """Make vLLM's Qwen3.5 code importable without torchvision, and map the trainer's adapter names onto its modules."""
    import vllm

    if not vllm.__version__.startswith(_VLLM_SERIES):
        logger.warning("vLLM %s: Qwen3.5 adapters unmapped (this plugin is for %sx)", vllm.__version__, _VLLM_SERIES)
        return
    if _TORCHVISION_MODULE not in sys.modules and importlib.util.find_spec("torchvision") is None:
        sys.modules[_TORCHVISION_MODULE] = importlib.import_module(_PIL_MODULE)

    from vllm.model_executor.models import qwen3_5
    from vllm.model_executor.models.utils import WeightsMapper

    trainer_names = WeightsMapper(orig_to_new_prefix={TRAINER_PREFIX: VLLM_PREFIX})
    for model in (qwen3_5.Qwen3_5ForConditionalGeneration, qwen3_5.Qwen3_5MoeForConditionalGeneration):
        model.hf_to_vllm_mapper = model.hf_to_vllm_mapper | trainer_names
