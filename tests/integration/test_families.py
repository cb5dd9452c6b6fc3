"""The families beside Qwen2 that a CPU Sampler serves, through the whole app (runs after the quota tests: the shared
app is replaced by one serving a tiny Qwen3, Llama 3 and Qwen3-MoE, each built offline; test_postgres_app replaces it
next, then brings the standard app back). With MLP-only LoRA (expert LoRA on the MoE) the real SDK's loss falls,
get_info names the family, and the Sampler's vLLM gives the trained adapter's own tokens the trainer's logprobs. The
trainer side of every family, gpt-oss included, is tests/unit/training/test_family_engines.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from tests.integration.conftest import replace_app
from tests.integration.helpers import sft_datums, trainer_logprobs

# family -> embedded preset; Qwen3-MoE's experts run through app.sampling.cpu_moe_lora in the CPU Sampler
FAMILY_BASES = {"qwen3": "tiny-qwen3", "llama": "tiny-llama", "qwen3_moe": "tiny-qwen3-moe"}
SAMPLER_ATOL = 2e-4  # as tests/integration/test_sampling.py: float32 vLLM and torch agree to ~1e-5


def _base(preset: str, root: Path) -> dict:
    return {
        "name": f"tinker-serve/{preset}",
        "path": str(root / preset),
        "embedded_preset": preset,
        "trainer": {"num_workers": 1, "cpus_per_worker": 0.5, "dtype": "float32"},
        "sampler": {"kv_cache_mib": 32, "num_cpus": 0.5, "dtype": "float32"},
    }


@pytest.fixture(scope="module")
def client(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tinker.ServiceClient]:
    root = tmp_path_factory.mktemp("families")
    config = {
        "state_dir": str(root / "state"),
        "auth": {"mode": "any_tml_key_on_loopback"},
        "base_models": [_base(preset, root) for preset in FAMILY_BASES.values()],
        "engine": {"max_lora_rank": 8},  # vLLM sizes its LoRA buffers by it (x 2 for Qwen3-MoE's experts)
    }
    replace_app(config, base_url)
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-family-tests")
    yield service
    service.close("success").result()


def test_every_family_base_is_listed(client: tinker.ServiceClient) -> None:
    listed = {m.model_name for m in client.get_server_capabilities().supported_models}
    assert listed == {f"tinker-serve/{preset}" for preset in FAMILY_BASES.values()}


@pytest.mark.parametrize("family", FAMILY_BASES)
def test_mlp_only_lora_learns_and_its_sampler_agrees(client: tinker.ServiceClient, family: str) -> None:
    base = f"tinker-serve/{FAMILY_BASES[family]}"
    tc = client.create_lora_training_client(base, rank=8, seed=21, train_attn=False, train_unembed=False).result()
    assert tc.get_info().model_data.arch == family
    data = sft_datums(tc.get_tokenizer())
    losses = []
    for _ in range(4):
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    assert losses[-1] < 0.8 * losses[0], losses

    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = tc.get_tokenizer().encode("What is 12 + 7? The answer")
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    (sequence,) = sampler.sample(types.ModelInput.from_ints(prompt), 1, params).result().sequences
    expected = trainer_logprobs(tc, prompt + sequence.tokens)[-len(sequence.tokens) :]
    print(
        f"{family}: loss {losses[0]:.1f} -> {losses[-1]:.1f}; sampler vs trainer max |dlogprob| "
        f"{np.abs(np.asarray(sequence.logprobs) - expected).max():.1e}"
    )  # pytest -s
    np.testing.assert_allclose(sequence.logprobs, expected, atol=SAMPLER_ATOL)
