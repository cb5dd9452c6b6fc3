"""An adapter trained by plain PEFT outside the server, uploaded over the 0.39/0.40 wire (external_weights_upload_start,
a PUT per file with the returned headers, external_weights_upload_finish), then trained further and sampled: the
server's trainer and sampler logprobs equal the same adapter's in PEFT."""

from __future__ import annotations

from pathlib import Path

import httpx
import numpy as np
import torch
from peft import LoraConfig, get_peft_model
from tinker import types

from app.training.base_model import load_base_model
from tests.conftest import TINY_MODEL
from tests.integration.conftest import BASE_MODEL
from tests.integration.helpers import logprobs_of, packed, peft_logprobs, raw_client, sft_datums, train_steps
from tests.tolerances import assert_sums_close, network_terms

RANK = 4
TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
SAMPLER_ATOL = 2e-4  # fp32 on CPU: vLLM and torch agree to ~1e-5; LoRA kernels add a little (as test_sampling)


def _trained_elsewhere(data: list[types.Datum], out: Path) -> None:
    """Three AdamW steps of a rank-4 PEFT LoRA on the tiny base in this process, saved as PEFT saves it."""
    torch.manual_seed(7)
    config = LoraConfig(r=RANK, lora_alpha=16, target_modules=TARGETS, lora_dropout=0.0)
    model = get_peft_model(load_base_model(str(TINY_MODEL)), config)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    batch = packed(data)
    for _ in range(3):
        for i in range(batch.num_datums):
            ids = torch.from_numpy(batch.tokens[batch.datum_slice(i)])[None]
            targets = torch.from_numpy(batch.loss_inputs["target_tokens"][batch.datum_slice(i)])
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            (-logprobs.gather(1, targets[:, None]).mean()).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.save_pretrained(str(out))


def _upload(http: httpx.Client, directory: Path) -> str:
    started = http.post(
        "/api/v1/external_weights_upload_start",
        json={"base_model": BASE_MODEL, "lora_config": {"rank": RANK}, "destination_project_id": None},
    )
    assert started.status_code == 200, started.text
    for name, target in started.json()["urls"].items():
        put = httpx.put(target["url"], content=(directory / name).read_bytes(), headers=target["headers"])
        assert put.status_code == 200, put.text
    finished = http.post("/api/v1/external_weights_upload_finish", json={"upload_id": started.json()["upload_id"]})
    assert finished.status_code == 200, finished.text
    return str(finished.json()["tinker_path"])


def test_an_adapter_trained_elsewhere_is_uploaded_trained_further_and_sampled(service_client, base_url, tmp_path):
    tokenizer = service_client.create_sampling_client(base_model=BASE_MODEL).get_tokenizer()
    data = sft_datums(tokenizer)
    _trained_elsewhere(data, tmp_path / "adapter")
    expected = peft_logprobs(tmp_path / "adapter", data)
    with raw_client(base_url, "tml-integration-tests") as http:
        path = _upload(http, tmp_path / "adapter")

    tc = service_client.create_training_client_from_state(path)
    uploaded = np.concatenate(logprobs_of(tc.forward(data, "cross_entropy").result()))
    assert_sums_close(uploaded, expected, network_terms(TINY_MODEL), np.float32)

    tokens = [*data[0].model_input.to_ints(), data[0].loss_fn_inputs["target_tokens"].to_numpy()[-1].item()]
    computed = service_client.create_sampling_client(model_path=path).compute_logprobs(
        types.ModelInput.from_ints(tokens)
    )
    np.testing.assert_allclose(computed.result()[1:], expected[: len(tokens) - 1], atol=SAMPLER_ATOL)

    train_steps(tc, data, 1, lr=1e-4)  # it trains on: a fresh optimizer (an uploaded adapter holds no optimizer state)
    after = np.concatenate(logprobs_of(tc.forward(data, "cross_entropy").result()))
    assert after.mean() > uploaded.mean()
    tc.load_state_with_optimizer(path).result()  # and loads back, its missing optimizer state kept fresh
    reloaded = np.concatenate(logprobs_of(tc.forward(data, "cross_entropy").result()))
    assert_sums_close(reloaded, expected, network_terms(TINY_MODEL), np.float32)
