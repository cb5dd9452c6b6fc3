"""vLLM's Qwen3.5 and Qwen3.5-MoE vision-language models as the Sampler serves them: text, with our adapters (a vLLM
general plugin, loaded in the Sampler's processes).

Qwen3.5 checkpoints are vision-language models (`Qwen3_5ForConditionalGeneration`); the Sampler starts vLLM with
`language_model_only` (app.models.families), so the vision tower is neither built nor asked for its processor. Two
things still stood in the way:

- vLLM's model code imports `smart_resize` from transformers' torchvision image processor module, which imports
  torchvision first. The CPU install has none (PyPI's wheels are CUDA builds that do not load on a CPU torch), so every
  Qwen3.5 architecture failed vLLM's model inspection. Without torchvision that module name is given the PIL image
  processor's module, whose `smart_resize` is the same function.
- On a vision-language base (app.sampling.vision) vLLM builds the model's processor, `Qwen3VLProcessor`, whose video
  processor transformers offers only with torchvision: without it the class and its base class are placeholders that
  raise ImportError. The Sampler takes no video (its video limit is 0), so the real classes, importable
  without torchvision, stand in for the placeholders; their torchvision calls are never reached.
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
from typing import Any

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
        _video_processor_without_torchvision()

    from vllm.model_executor.models import qwen3_5
    from vllm.model_executor.models.utils import WeightsMapper

    trainer_names = WeightsMapper(orig_to_new_prefix={TRAINER_PREFIX: VLLM_PREFIX})
    for model in (qwen3_5.Qwen3_5ForConditionalGeneration, qwen3_5.Qwen3_5MoeForConditionalGeneration):
        model.hf_to_vllm_mapper = model.hf_to_vllm_mapper | trainer_names


def _video_processor_without_torchvision() -> None:
    """Let transformers build Qwen3VLProcessor without torchvision: its video processor class and the base class a
    processor checks its video processor against, as they are (importable), for transformers' placeholders."""
    from transformers import processing_utils
    from transformers.models.auto import video_processing_auto
    from transformers.models.qwen3_vl.video_processing_qwen3_vl import Qwen3VLVideoProcessor
    from transformers.video_processing_utils import VideoProcessorMixin

    load_backend_class = video_processing_auto._load_backend_class

    def _load(video_processor_class_name: str, backend: str) -> Any:
        if video_processor_class_name == Qwen3VLVideoProcessor.__name__:
            return Qwen3VLVideoProcessor
        return load_backend_class(video_processor_class_name, backend)

    video_processing_auto._load_backend_class = _load
    setattr(processing_utils.transformers_module, VideoProcessorMixin.__name__, VideoProcessorMixin)
