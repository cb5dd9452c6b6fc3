"""The sampling engine: one vLLM `AsyncLLM` with multi-LoRA, translating SampleArgs in and SampleResult out.

Base-model requests go through an all-zero adapter, so no batch ever mixes LoRA and non-LoRA rows
(vLLM's CPU LoRA kernels give non-LoRA rows the last slot's adapter: reference/vllm-cpu.md, section 4).
Adapters are cached by their integer id, so every loaded directory version gets a fresh one.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from app.config import SamplerConfig
from app.errors import ServerError
from app.models.families import Family, family_of
from app.models.model_config import ModelShape, model_shape
from app.sampling.params import SampleArgs
from app.sampling.response import SampledSequence, SampleResult, TopK
from app.sampling.vision import Vision, check_expanded, vision_of

if TYPE_CHECKING:
    from vllm.config.lora import MaxLoRARanks
    from vllm.config.model import ModelDType
    from vllm.lora.request import LoRARequest
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.engine.async_llm import AsyncLLM

    from app.sampling.openai import OpenAIServer

logger = logging.getLogger("tinker_serve.sampler")
LONG_CONTEXT_ENV = "VLLM_ALLOW_LONG_MAX_MODEL_LEN"
_VLLM_LORA_RANKS: tuple[MaxLoRARanks, ...] = (1, 8, 16, 32, 64, 128, 256, 320, 512)


def vllm_lora_rank(max_rank: int) -> MaxLoRARanks:
    """The smallest rank vLLM accepts as `max_lora_rank` that holds `max_rank`."""
    return next((r for r in _VLLM_LORA_RANKS if r >= max_rank), _VLLM_LORA_RANKS[-1])


def allow_scaled_context(shape: ModelShape, max_model_len: int) -> None:
    """Let vLLM start at a `max_model_len` beyond the model's max_position_embeddings: what its RoPE scaling gives
    (app.models.model_config). vLLM derives a YaRN model's context from max_position_embeddings alone and refuses a
    longer one unless LONG_CONTEXT_ENV is set in its process."""
    if max_model_len > shape.max_position_embeddings:
        os.environ[LONG_CONTEXT_ENV] = "1"


def import_vllm() -> None:
    """Import what `SamplerEngine.start` uses from vLLM (about 10 s on 2 cores): a replica that waits for its
    trainer runs this meanwhile, in a thread, so the engine starts sooner once it may."""
    import vllm.engine.arg_utils
    import vllm.lora.request
    import vllm.v1.engine.async_llm  # noqa: F401


class SamplerEngine:
    def __init__(self, llm: AsyncLLM, zero_adapter: LoRARequest, family: Family, vision: Vision | None) -> None:
        self._llm = llm
        self._zero = zero_adapter
        self._family = family
        self._vision = vision
        self._ids = itertools.count(2)  # 1 is the zero adapter

    @classmethod
    async def start(
        cls,
        model_path: str,
        config: SamplerConfig,
        *,
        max_lora_rank: int,
        max_model_len: int,
        work_dir: Path,
        max_images: int = 0,
    ) -> SamplerEngine:
        """`max_images`: images per prompt, on a vision-language base (app.sampling.vision); 0 serves it as text."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.lora.request import LoRARequest
        from vllm.v1.engine.async_llm import AsyncLLM

        from app.sampling.adapters import write_zero_adapter  # torch and transformers: the replica's, not the builder's
        from app.sampling.engine_core_guard import guard_engine_cores

        started = time.monotonic()
        shape = model_shape(model_path)
        family = family_of(shape.model_type)
        allow_scaled_context(shape, max_model_len)
        vision = vision_of(model_path, max_images) if max_images else None
        on_gpu = config.num_gpus > 0
        dtype = config.dtype  # auto resolved already (app.config.BaseModelConfig.sampler_dtype)
        args = AsyncEngineArgs(
            model=model_path,
            dtype=cast("ModelDType", dtype),  # config.dtype passes through: vLLM checks it
            max_model_len=max_model_len,
            enforce_eager=config.enforce_eager,
            enable_lora=True,
            max_lora_rank=vllm_lora_rank(max_lora_rank * family.sampler_rank_factor),
            max_loras=config.max_loras,
            max_cpu_loras=config.max_cpu_loras,
            max_num_seqs=config.max_num_seqs,
            seed=0,
            tensor_parallel_size=config.tensor_parallel_size,
            **family.vllm_options | (vision.engine_options() if vision else {}),
            **(
                {"gpu_memory_utilization": config.gpu_memory_utilization}
                if on_gpu
                else {"kv_cache_memory_bytes": config.kv_cache_bytes()}
            ),
        )
        guard_engine_cores()  # its engine core process dies with this one, however this one ends
        llm = AsyncLLM.from_engine_args(args)
        zero_dir = write_zero_adapter(model_path, work_dir / "zero_adapter")
        zero = LoRARequest("base", 1, str(zero_dir))
        await llm.add_lora(zero)  # not pinned: with pin_lora, concurrent multi-adapter batches crashed vLLM (KeyError)
        logger.info("vLLM engine for %s ready in %.1f s", model_path, time.monotonic() - started)
        return cls(llm, zero, family, vision)

    @property
    def base_adapter(self) -> LoRARequest:
        """The all-zero adapter that base-model requests run through."""
        return self._zero

    def openai_server(self, served_name: str) -> OpenAIServer:
        """vLLM's OpenAI serving layer over this engine."""
        from app.sampling.openai import OpenAIServer

        return OpenAIServer.start(self._llm, served_name)

    async def load_adapter(self, directory: str) -> LoRARequest:
        """Load a PEFT adapter directory under a new id. Our trainers wrote it, so a failure is the server's."""
        from vllm.lora.request import LoRARequest

        adapter_id = next(self._ids)
        request = LoRARequest(f"adapter-{adapter_id}", adapter_id, directory, **self._family.lora_request)
        started = time.monotonic()
        await self._llm.add_lora(request)
        logger.info("loaded adapter %s as id %d in %.3f s", directory, adapter_id, time.monotonic() - started)
        return request

    async def sample(self, args: SampleArgs, adapter: LoRARequest | None) -> SampleResult:
        """Sample `args.num_samples` sequences (greedy ones as separate requests: vLLM wants n=1 there)."""
        lora = adapter or self._zero
        if args.temperature == 0 and args.num_samples > 1:
            outputs = await asyncio.gather(
                *(self._generate(args, 1, lora, with_prompt=i == 0) for i in range(args.num_samples))
            )
            completions = [c for out in outputs for c in out.outputs]
            first = outputs[0]
        else:
            first = await self._generate(args, args.num_samples, lora, with_prompt=True)
            completions = list(first.outputs)
        prompt_lps, prompt_topk = _prompt_logprobs(first, args)
        return SampleResult(
            sequences=[_sequence(c, args.topk_sample_logprobs) for c in completions],
            prompt_logprobs=prompt_lps,
            topk_prompt_logprobs=prompt_topk,
            prompt_cache_hit_tokens=first.num_cached_tokens or 0,
        )

    async def _generate(self, args: SampleArgs, n: int, lora: LoRARequest, *, with_prompt: bool) -> RequestOutput:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        params = SamplingParams(
            n=n,
            max_tokens=args.max_tokens,
            temperature=args.temperature,
            top_k=args.top_k,
            top_p=args.top_p,
            seed=args.seed,
            stop=list(args.stop_strings) or None,
            stop_token_ids=list(args.stop_token_ids) or None,
            ignore_eos=args.ignore_eos,
            logprobs=args.topk_sample_logprobs,
            prompt_logprobs=args.topk_prompt_logprobs if with_prompt and args.wants_prompt_logprobs else None,
            detokenize=bool(args.stop_strings),
            output_kind=RequestOutputKind.FINAL_ONLY,
        )
        if args.images and self._vision is None:
            raise ServerError("this sampler serves its base as text: it has no image processor")
        prompt = await self._vision.engine_prompt(args) if self._vision else {"prompt_token_ids": list(args.prompt)}
        final = None  # vLLM's own request checks raise ValueError: sample_args checks first, so one is our fault
        async for output in self._llm.generate(
            cast("Any", prompt), params, request_id=uuid.uuid4().hex, lora_request=lora
        ):
            final = output
        if final is None or not final.finished:
            raise ServerError("the sampler ended a request without a result; retry it")
        check_expanded(args, len(final.prompt_token_ids or ()))
        return final

    async def check_health(self) -> None:
        """Raises once vLLM's engine process has died (the replica must then be replaced)."""
        await self._llm.check_health()

    def shutdown(self) -> None:
        self._llm.shutdown()


def _topk(entries: dict[int, Any] | None, k: int) -> TopK | None:
    """The k best (token, logprob) of a vLLM logprob dict, which also holds the chosen token."""
    if not entries or k == 0:
        return None
    ranked = sorted(entries.items(), key=lambda item: item[1].rank)
    return [(token, lp.logprob) for token, lp in ranked if lp.rank <= k][:k]


def _sequence(completion: CompletionOutput, topk: int) -> SampledSequence:
    if completion.finish_reason not in ("stop", "length"):
        raise ServerError(f"the sampler stopped a sequence for reason {completion.finish_reason!r}; retry it")
    stop_reason = cast(Literal["stop", "length"], completion.finish_reason)  # checked just above
    tokens = list(completion.token_ids)
    steps = completion.logprobs or []
    # vLLM types FlatLogprobs as a sequence of `dict | None`; sampled steps always have their dict
    logprobs = [step[token].logprob for token, step in zip(tokens, steps)]  # type: ignore[index]
    return SampledSequence(
        tokens=tokens,
        logprobs=logprobs,
        stop_reason=stop_reason,
        topk_logprobs=[_topk(step, topk) for step in steps] if topk else None,
    )


def _prompt_logprobs(output: RequestOutput, args: SampleArgs) -> tuple[list | None, list | None]:
    """Per prompt position: the prompt token's logprob (None at 0 and before the last N) and the top-k."""
    if not args.wants_prompt_logprobs:
        return None, None
    entries = output.prompt_logprobs or [None] * len(args.prompt)
    first_scored = 1 if args.prompt_logprobs_last_n is None else max(1, len(args.prompt) - args.prompt_logprobs_last_n)
    values: list[float | None] = [
        entry[token].logprob if entry is not None and i >= first_scored else None
        for i, (token, entry) in enumerate(zip(args.prompt, entries))
    ]
    topk = [_topk(entry, args.topk_prompt_logprobs) for entry in entries] if args.topk_prompt_logprobs else None
    return (values if args.prompt_logprobs else None), topk
