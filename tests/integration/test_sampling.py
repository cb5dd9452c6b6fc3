"""Sampling through the real SDK, the Serve Sampler deployment and vLLM, checked against the trainer."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import numpy as np
import pytest
import tinker
import torch
from tinker import types

from tests.integration.conftest import BASE_MODEL, EPHEMERAL_TTL_S, MAX_PENDING_SAMPLES
from tests.integration.helpers import SENTENCES, new_client, sft_datums, train_steps, trainer_logprobs

ATOL = 2e-4  # fp32 on CPU: vLLM and torch agree to ~1e-5; LoRA kernels add a little
EXPIRY_PARAMS = types.SamplingParams(max_tokens=3, seed=0)


def trained_client(service_client: tinker.ServiceClient, seed: int, steps: int = 3) -> tinker.TrainingClient:
    tc = new_client(service_client, seed=seed)
    train_steps(tc, sft_datums(tc.get_tokenizer(), count=2 + seed % 3), steps=steps, lr=3e-3)
    return tc


@pytest.fixture(scope="module")
def trained(service_client: tinker.ServiceClient) -> tinker.TrainingClient:
    return trained_client(service_client, seed=11)


@pytest.fixture(scope="module")
def base_sampler(service_client: tinker.ServiceClient) -> tinker.SamplingClient:
    return service_client.create_sampling_client(base_model=BASE_MODEL).result()


@pytest.fixture(scope="module")
def prompt(trained: tinker.TrainingClient) -> list[int]:
    return trained.get_tokenizer().encode("What is 12 + 7? The answer")


@dataclass(frozen=True)
class Unused:
    """An ephemeral sampler, its adapter directories, and when it was last used (time.monotonic())."""

    sampler: tinker.SamplingClient
    directories: list[Path]
    last_used: float


@pytest.fixture(scope="module", autouse=True)
def unused_ephemeral(trained: tinker.TrainingClient, prompt: list[int], state_dir: Path) -> Unused:
    """An ephemeral sampler used once as the module starts, then left alone: its TTL runs out while the tests
    before test_ephemeral_sampler_expires_and_persistent_one_survives run, instead of in a sleep of its own."""
    sampler = trained.save_weights_and_get_sampling_client().result()
    sampler.sample(types.ModelInput.from_ints(prompt), 1, EXPIRY_PARAMS).result()
    last_used = time.monotonic()
    directories = list((state_dir / "checkpoints" / "ephemeral").iterdir())
    assert directories
    return Unused(sampler, directories, last_used)


def test_sampler_logprobs_equal_trainer_logprobs(trained, prompt):
    sampler = trained.save_weights_and_get_sampling_client().result()
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    result = sampler.sample(types.ModelInput.from_ints(prompt), 2, params).result()
    assert len(result.sequences) == 2 and result.sequences[0].tokens != result.sequences[1].tokens
    for seq in result.sequences:
        assert len(seq.tokens) == len(seq.logprobs) == 12 and seq.stop_reason == "length"
        expected = trainer_logprobs(trained, prompt + seq.tokens)[-len(seq.tokens) :]
        np.testing.assert_allclose(seq.logprobs, expected, atol=ATOL)
    full = prompt + result.sequences[0].tokens
    computed = sampler.compute_logprobs(types.ModelInput.from_ints(full)).result()
    assert computed[0] is None and len(computed) == len(full)
    np.testing.assert_allclose(computed[1:], trainer_logprobs(trained, full), atol=ATOL)


def test_prompt_logprob_options(trained, base_sampler, prompt):
    result = base_sampler.sample(
        types.ModelInput.from_ints(prompt),
        1,
        types.SamplingParams(max_tokens=4, seed=1),
        include_prompt_logprobs=True,
        topk_prompt_logprobs=3,
        topk_sample_logprobs=2,
        prompt_logprobs_last_n=3,
    ).result()
    lps = result.prompt_logprobs
    assert len(lps) == len(prompt) and all(v is None for v in lps[:-3]) and all(v is not None for v in lps[-3:])
    topk = result.topk_prompt_logprobs
    assert topk[0] is None and all(len(row) == 3 for row in topk[1:])
    assert all(row[0][1] >= row[1][1] >= row[2][1] for row in topk[1:])
    sampled_topk = result.sequences[0].topk_logprobs
    assert len(sampled_topk) == 4 and all(len(row) == 2 for row in sampled_topk)
    for token, logprob, row in zip(result.sequences[0].tokens, result.sequences[0].logprobs, sampled_topk):
        assert logprob <= row[0][1] + 1e-6 and (token != row[0][0] or abs(logprob - row[0][1]) < 1e-5)


def test_tokenizer_by_model_name_offline(base_sampler, trained):
    """The app registered its served name in the Hugging Face cache: SamplingClient.get_tokenizer() (which loads
    by base model name, as the cookbook's get_tokenizer does) works offline and equals the trainer's."""
    assert base_sampler.get_base_model() == BASE_MODEL
    by_name, trainer_side = base_sampler.get_tokenizer(), trained.get_tokenizer()
    assert by_name.encode(SENTENCES[0]) == trainer_side.encode(SENTENCES[0])


def test_greedy_and_seed_determinism(base_sampler, prompt):
    model_input = types.ModelInput.from_ints(prompt)
    greedy = types.SamplingParams(max_tokens=10, temperature=0.0)
    first = base_sampler.sample(model_input, 3, greedy).result()
    again = base_sampler.sample(model_input, 1, greedy).result()
    assert len({tuple(s.tokens) for s in first.sequences}) == 1
    assert again.sequences[0].tokens == first.sequences[0].tokens
    seeded = [
        base_sampler.sample(model_input, 2, types.SamplingParams(max_tokens=10, seed=s)).result() for s in (5, 5, 6)
    ]
    tokens = [[seq.tokens for seq in r.sequences] for r in seeded]
    assert tokens[0] == tokens[1] and tokens[0] != tokens[2]


def test_stop_tokens_strings_and_empty_stop(base_sampler, prompt, trained):
    model_input = types.ModelInput.from_ints(prompt)
    free = base_sampler.sample(model_input, 1, types.SamplingParams(max_tokens=12, seed=9)).result().sequences[0]
    stop_token = free.tokens[4]
    by_token = base_sampler.sample(model_input, 1, types.SamplingParams(max_tokens=12, seed=9, stop=[stop_token]))
    seq = by_token.result().sequences[0]
    cut = free.tokens.index(stop_token) + 1
    assert seq.stop_reason == "stop" and seq.tokens == free.tokens[:cut]

    text = trained.get_tokenizer().decode(free.tokens[3:5])
    by_string = base_sampler.sample(model_input, 1, types.SamplingParams(max_tokens=12, seed=9, stop=[text]))
    seq = by_string.result().sequences[0]
    assert seq.stop_reason == "stop" and len(seq.tokens) <= 5 and seq.tokens == free.tokens[: len(seq.tokens)]

    no_stop = base_sampler.sample(model_input, 1, types.SamplingParams(max_tokens=30, seed=9, stop=[])).result()
    assert no_stop.sequences[0].stop_reason == "length" and len(no_stop.sequences[0].tokens) == 30


def test_three_adapters_and_the_base_sampled_concurrently(service_client, base_sampler, reference_base):
    clients = [trained_client(service_client, seed=s, steps=2) for s in (21, 22, 23)]
    samplers = [
        service_client.create_sampling_client(
            model_path=tc.save_weights_for_sampler(f"multi-{i}").result().path
        ).result()
        for i, tc in enumerate(clients)
    ]
    tokenizer = clients[0].get_tokenizer()
    prompts = [tokenizer.encode(text) for text in SENTENCES[:3]]
    expected = [[trainer_logprobs(tc, p) for p in prompts] for tc in clients]
    with torch.no_grad():
        expected.append(
            [
                torch.log_softmax(reference_base(torch.tensor([p])).logits[0, :-1].float(), -1)
                .gather(-1, torch.tensor(p[1:])[:, None])[:, 0]
                .numpy()
                for p in prompts
            ]
        )

    async def all_at_once() -> list[list[list[float | None]]]:
        everyone = [*samplers, base_sampler]
        calls = [s.compute_logprobs(types.ModelInput.from_ints(p)) for s in everyone for p in prompts]
        flat = await asyncio.gather(*calls)
        return [flat[i * len(prompts) : (i + 1) * len(prompts)] for i in range(len(everyone))]

    results = asyncio.run(all_at_once())
    for got_model, want_model in zip(results, expected):
        for got, want in zip(got_model, want_model):
            np.testing.assert_allclose(np.array(got[1:], dtype=np.float64), want, atol=ATOL)
    spread = [float(np.abs(expected[i][0] - expected[3][0]).max()) for i in range(3)]
    assert min(spread) > 100 * ATOL, f"adapters too close to the base to tell apart: {spread}"


def test_ephemeral_sampler_expires_and_persistent_one_survives(trained, prompt, unused_ephemeral: Unused):
    model_input = types.ModelInput.from_ints(prompt)
    persistent_path = trained.save_weights_for_sampler("survivor").result().path
    time.sleep(max(0.0, unused_ephemeral.last_used + EPHEMERAL_TTL_S + 1 - time.monotonic()))  # unused past its TTL
    started = time.monotonic()
    with pytest.raises(tinker.NotFoundError, match="expired"):
        unused_ephemeral.sampler.sample(model_input, 1, EXPIRY_PARAMS).result()
    assert time.monotonic() - started < 10
    persistent = trained.create_sampling_client(persistent_path).result()
    assert len(persistent.sample(model_input, 1, EXPIRY_PARAMS).result().sequences[0].tokens) == 3
    deadline = time.monotonic() + EPHEMERAL_TTL_S
    while any(d.exists() for d in unused_ephemeral.directories) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not any(d.exists() for d in unused_ephemeral.directories), "expired adapter directories were not swept"


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda s, p: s.sample(p, 100_000, types.SamplingParams(max_tokens=2)), "num_samples"),
        (lambda s, p: s.sample(p, 1, types.SamplingParams(max_tokens=-1)), "max_tokens"),
        (
            lambda s, p: s.sample(p, 1, types.SamplingParams(max_tokens=2), topk_sample_logprobs=10_000),
            "topk_sample_logprobs",
        ),
        (
            lambda s, p: s.sample(types.ModelInput.from_ints([5] * 2048), 1, types.SamplingParams(max_tokens=2)),
            "prompt",
        ),
        (lambda s, p: s.sample(p, 1, types.SamplingParams(max_tokens=2), prompt_alt_tokens_k=2), "prompt_alt_tokens_k"),
        (lambda s, p: s.sample(p, 1, types.SamplingParams(max_tokens=2, top_p=0.0)), "top_p"),
    ],
)
def test_bad_sampling_requests_fail_promptly(base_sampler, prompt, call, field):
    started = time.monotonic()
    with pytest.raises(tinker.BadRequestError, match=field):
        call(base_sampler, types.ModelInput.from_ints(prompt)).result()
    assert time.monotonic() - started < 10


def test_unknown_sampler_path_fails_promptly(service_client, trained):
    for path in (
        f"tinker://{trained.model_id}/sampler_weights/never-saved",
        "tinker://nobody:train:0/sampler_weights/x",
    ):
        started = time.monotonic()
        with pytest.raises(tinker.NotFoundError, match="model_path"):
            service_client.create_sampling_client(model_path=path).result()
        assert time.monotonic() - started < 10


def test_saturation_answers_429_with_queue_state_and_loses_nothing(base_url):
    """Raw HTTP, as the SDK sends it: past quotas.max_pending_samples a submit gets 429, never a silent drop."""
    headers = {"X-API-Key": "tml-integration-tests"}
    with httpx.Client(base_url=base_url, headers=headers, timeout=30) as http:
        session = http.post("/api/v1/create_session", json={}).json()["session_id"]
        sampler = http.post(
            "/api/v1/create_sampling_session",
            json={
                "session_id": session,
                "sampling_session_seq_id": 0,
                "base_model": BASE_MODEL,
            },
        ).json()["sampling_session_id"]

        async def submit_all() -> list[httpx.Response]:
            async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=30) as client:
                return await asyncio.gather(
                    *(
                        client.post(
                            "/api/v1/asample",
                            json={
                                "sampling_session_id": sampler,
                                "seq_id": i,
                                "num_samples": 1,
                                "prompt": {"chunks": [{"type": "encoded_text", "tokens": [5, 6, 7]}]},
                                "sampling_params": {"max_tokens": 400, "stop": [], "seed": i},
                            },
                        )
                        for i in range(3 * MAX_PENDING_SAMPLES)
                    )
                )

        responses = asyncio.run(submit_all())
        accepted = [r.json()["request_id"] for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code == 429]
        assert len(accepted) + len(refused) == len(responses)
        assert refused and all(r.json()["queue_state"] == "paused_capacity" for r in refused)
        assert len(accepted) >= MAX_PENDING_SAMPLES
        for request_id in accepted:  # every accepted sample finishes
            while (
                body := http.post(
                    "/api/v1/retrieve_future", json={"request_id": request_id}, headers={"Accept": "application/json"}
                ).json()
            ).get("type") == "try_again":
                pass
            assert len(body["sequences"][0]["tokens"]) == 400
