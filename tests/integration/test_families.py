"""Families through the whole app (on the session's last app: conftest's `families_on_postgres`, a tiny base of each
family in FAMILY_BASES, each built offline, over PostgreSQL): with MLP-only LoRA (expert LoRA on the MoE) the real
SDK's loss falls, get_info names the family, and the Sampler's vLLM gives the trained adapter's own tokens the
trainer's logprobs. The trainer side of every family, gpt-oss included, is tests/unit/training/test_family_engines.py;
the sampler side of every other family, one engine at a time, tests/integration/test_family_samplers.py."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
from tinker import types

from tests.integration.conftest import FAMILY_BASES
from tests.integration.helpers import sft_datums, trainer_logprobs
from tests.integration.test_sdk_versions import OLDEST_SDK_PYTHON  # the oldest SDK's own venv

SAMPLER_ATOL = 2e-4  # as tests/integration/test_sampling.py: float32 vLLM and torch agree to ~1e-5


@pytest.fixture(scope="module")
def client(families_on_postgres: str, base_url: str) -> Iterator[tinker.ServiceClient]:
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-family-tests")
    yield service
    service.close("success").result()


def test_every_family_base_is_listed_and_its_hub_repo_resolves(client: tinker.ServiceClient, base_url: str) -> None:
    """Listed by name, and each name a Hub repo id on the /hub routes, the bare one (no org) too."""
    listed = {m.model_name for m in client.get_server_capabilities().supported_models}
    assert listed == set(FAMILY_BASES.values())
    with httpx.Client(base_url=f"{base_url}/hub", timeout=10) as http:
        for name in FAMILY_BASES.values():
            head = http.head(f"/{name}/resolve/main/tokenizer.json")
            assert head.status_code == 200 and len(head.headers["x-repo-commit"]) == 40, name
            info = http.get(f"/api/models/{name}").json()
            assert info["id"] == name and {"rfilename": "config.json"} in info["siblings"]
            tree = http.get(f"/api/models/{name}/tree/main").json()
            assert "config.json" in {entry["path"] for entry in tree}, tree


# A client on another machine: an empty Hugging Face cache, the server's /hub routes as its Hub.
REMOTE_TOKENIZER = """
import json, sys, tinker
url, name = sys.argv[1:]
tc = tinker.ServiceClient(base_url=url, api_key="tml-family-tests").create_lora_training_client(base_model=name, rank=8)
tc = tc.result() if hasattr(tc, "result") else tc  # 0.38 hands back a future, 0.25 the client
print(json.dumps({"version": tinker.__version__, "ids": tc.get_tokenizer().encode("What is 12 + 7?")}))
"""


def test_a_bare_base_names_tokenizer_resolves_for_both_sdk_ends(
    client: tinker.ServiceClient, base_url: str, tmp_path: Path
) -> None:
    """`tiny-qwen3_5-moe` has no org: the oldest SDK we claim and the installed one each fetch its tokenizer from the
    /hub routes, and both encode as the server's own tokenizer does."""
    name = FAMILY_BASES["qwen3_5_moe"]
    seen = {}
    for python in (OLDEST_SDK_PYTHON, Path(sys.executable)):
        env = {
            "PATH": "/usr/bin:/bin",
            "HF_HOME": str(tmp_path / python.parent.parent.name),
            "HF_ENDPOINT": f"{base_url}/hub",
        }
        done = subprocess.run(
            [str(python), "-c", REMOTE_TOKENIZER, base_url, name], capture_output=True, text=True, timeout=300, env=env
        )
        assert done.returncode == 0, done.stderr[-3000:]
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        seen[answer["version"][:4]] = answer["ids"]
    here = client.create_lora_training_client(name, rank=8).result().get_tokenizer()  # the server's own files
    assert seen == {"0.25": here.encode("What is 12 + 7?"), "0.38": here.encode("What is 12 + 7?")}, seen


@pytest.mark.parametrize("family", FAMILY_BASES)
def test_mlp_only_lora_learns_and_its_sampler_agrees(client: tinker.ServiceClient, family: str) -> None:
    base = FAMILY_BASES[family]
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
