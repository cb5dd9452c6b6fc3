"""Every family beside Qwen2, Qwen3 and Qwen3.5-MoE (Llama 3, Qwen3-MoE, and the lineup's Qwen3.5, Nemotron-H,
DeepSeek-V3, GLM-4.5, and Qwen3-VL) on the CPU Sampler's real vLLM engine, as the Sampler replica sets it up (its engine
options, plugins and environment), against the trainer's real engine: the trainer's MLP-only and attention + MLP
adapters learn, and vLLM gives each exported adapter's own sampled tokens the trainer's logprobs, on the
vision-language bases (Qwen3.5, Qwen3-VL) after a prompt with an image too. In LANES processes of their own, one
family's engine at a time in each (tests/integration/family_samplers.py): the families app took 150 s to start on 2
cores with four bases and ~50 s with two, so it keeps Qwen3 and Qwen3.5-MoE, whose same three checks run there through
the real SDK (an MLP-only adapter, test_families.py; attention + MLP after an image prompt, test_image_sampling.py),
and this covers every other family. gpt-oss samples on GPUs only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.sampling.cpu_env import replica_env
from tests.conftest import ROOT

# Processes run side by side, each taking every LANES-th check: a check's vLLM engine runs in an engine core process
# spawned afresh (vLLM's CPU platform always spawns it), whose imports (torch, transformers, vLLM) take one core
# ~10 s: in one process the CI machine's second core sat idle through them.
LANES = 2
SAMPLER_ATOL = 2e-4  # as tests/integration/test_sampling.py: float32 vLLM and torch agree to ~1e-6 here
PRESETS = {
    "llama": "tiny-llama",
    "qwen3_moe": "tiny-qwen3-moe",
    "qwen3_5": "tiny-qwen3_5",
    "nemotron_h": "tiny-nemotron-h",
    "deepseek_v3": "tiny-deepseek-v3",
    "glm4_moe": "tiny-glm4-moe",
    "qwen3_vl": "tiny-qwen3-vl",
}
VISION = {"qwen3_5", "qwen3_vl"}  # their presets have a vision tower: their check samples an image too


@pytest.fixture(scope="module")
def checks(tmp_path_factory: pytest.TempPathFactory, presets_dir: Path) -> dict[str, dict]:
    out = tmp_path_factory.mktemp("family-samplers")
    names = ["kv_fit", *PRESETS.values()]  # family_samplers.KV_FIT: the KV cache check
    env = {**os.environ, **replica_env()}  # as a CPU Sampler replica's: no torch.compile, the model in vLLM's engine
    lanes = []
    try:
        for lane in range(LANES):
            command = [sys.executable, "-m", "tests.integration.family_samplers", str(out), str(presets_dir)]
            with (out / f"lane-{lane}.out").open("w") as stdout, (out / f"lane-{lane}.err").open("w") as stderr:
                lanes.append(
                    subprocess.Popen([*command, *names[lane::LANES]], cwd=ROOT, env=env, stdout=stdout, stderr=stderr)
                )
        deadline = time.monotonic() + 1200
        for lane, process in enumerate(lanes):
            process.wait(timeout=max(0.0, deadline - time.monotonic()))
            assert process.returncode == 0, (out / f"lane-{lane}.err").read_text()[-4000:]
    finally:
        for process in lanes:
            process.kill()
    lines = [
        json.loads(line)
        for lane in range(LANES)
        for line in (out / f"lane-{lane}.out").read_text().splitlines()
        if line.startswith("{")
    ]
    return {line.get("family", "kv_fit"): line for line in lines}


@pytest.mark.parametrize("family", PRESETS)
def test_adapters_learn_and_the_cpu_sampler_agrees_with_the_trainer(checks: dict[str, dict], family: str) -> None:
    check = checks[family]
    print(f"{family}: {check['max_abs_difference']} in {check['seconds']:.0f} s")  # pytest -s
    for adapter, losses in check["losses"].items():
        assert losses[-1] < 0.7 * losses[0], (adapter, losses)
    assert check["max_abs_difference"].keys() == {"mlp", "all", *(["image"] if family in VISION else [])}
    for adapter, difference in check["max_abs_difference"].items():
        assert difference <= SAMPLER_ATOL, (adapter, difference)


def test_a_sampler_whose_context_exceeds_its_kv_cache_starts_at_what_the_cache_holds(checks: dict[str, dict]) -> None:
    """vLLM counts its KV cache in whole blocks and keeps one back: the max_model_len the server derives from
    sampler.kv_cache_mib must start the engine, and a sequence that long samples."""
    fit = checks["kv_fit"]["kv_fit"]
    assert fit["max_model_len"] < fit["context"]
    assert fit["sampled"] == fit["max_model_len"] - 5  # the prompt filled all but a few positions, and one token more
