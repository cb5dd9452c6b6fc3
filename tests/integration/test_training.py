"""The real tinker SDK trains LoRA models through the real Serve app and TorchTrainer workers."""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types

from tests.conftest import TINY_MODEL
from tests.integration.conftest import BASE_MODEL, CHUNK_LEN
from tests.integration.helpers import logprobs_of, new_client, packed, reference_run, sft_datums, train_steps
from tests.tolerances import assert_sums_close, network_terms

ADAM = types.AdamParams(learning_rate=1e-2)
# the same training in passes mixed or chunked otherwise: float32 sums in another order (tests/tolerances.py)
TERMS = 2 * network_terms(TINY_MODEL)


def test_sft_loss_falls_steadily_over_20_pipelined_steps(service_client):
    tc = new_client(service_client, seed=1)
    data = sft_datums(tc.get_tokenizer())
    futures = []
    for _ in range(20):  # submit everything before waiting on anything
        futures.append(
            (tc.forward_backward(data, "cross_entropy"), tc.optim_step(types.AdamParams(learning_rate=3e-3)))
        )
    losses = []
    for fb, opt in futures:
        result = fb.result()
        opt.result()
        weights = np.concatenate([d.loss_fn_inputs["weights"].to_numpy() for d in data])
        expected = -float(np.sum(weights * np.concatenate(logprobs_of(result))))
        assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4)
        losses.append(result.metrics["loss:sum"])
    # A random-weight base with LoRA on attention and MLP only (no lm_head: vLLM cannot serve it) learns
    # steadily but slowly: about -23% in 20 steps here.
    assert losses[-1] < 0.85 * losses[0], losses
    assert all(b < a for a, b in zip(losses[::4], losses[4::4])), losses


def test_pipelined_equals_sequential(service_client):
    piped, seq = new_client(service_client, seed=7), new_client(service_client, seed=7)
    data = sft_datums(piped.get_tokenizer())
    pending = [(piped.forward_backward(data, "cross_entropy"), piped.optim_step(ADAM)) for _ in range(3)]
    for fb, opt in pending:
        fb.result(), opt.result()
    train_steps(seq, data, 3)
    after_piped = logprobs_of(piped.forward(data, "cross_entropy").result())
    after_seq = logprobs_of(seq.forward(data, "cross_entropy").result())
    for a, b in zip(after_piped, after_seq):
        assert_sums_close(a, b, TERMS, np.float32)


def test_chunked_two_worker_training_equals_one_chunk_on_one_worker(service_client, reference_base):
    """8 datums leave the SDK as 2 chunks of CHUNK_LEN; 2 data-parallel workers train them. The
    result must equal one 8-datum batch trained by a single in-process engine (same seed)."""
    tc = new_client(service_client, seed=11)
    data = sft_datums(tc.get_tokenizer(), count=8)
    assert len(data) > CHUNK_LEN
    train_steps(tc, data, 2)
    served = np.concatenate(logprobs_of(tc.forward(data, "cross_entropy").result()))
    reference = reference_run(reference_base, seed=11, rank=8, batch=packed(data), steps=2, lr=1e-2)
    assert_sums_close(served, reference, TERMS, np.float32)


def test_two_models_on_one_base_train_independently(service_client):
    trained, idle = new_client(service_client, seed=3), new_client(service_client, seed=3)
    data = sft_datums(trained.get_tokenizer())
    before = logprobs_of(idle.forward(data, "cross_entropy").result())
    train_steps(trained, data, 3)
    after_trained = logprobs_of(trained.forward(data, "cross_entropy").result())
    after_idle = logprobs_of(idle.forward(data, "cross_entropy").result())
    for b, a in zip(before, after_idle):
        np.testing.assert_array_equal(a, b)
    assert not np.allclose(np.concatenate(after_trained), np.concatenate(before), atol=1e-3)


def test_forward_only_does_not_train(service_client):
    tc = new_client(service_client, seed=5)
    data = sft_datums(tc.get_tokenizer())
    first = logprobs_of(tc.forward(data, "cross_entropy").result())
    tc.optim_step(ADAM).result()  # no gradients accumulated: Adam with zero moments makes no update
    again = logprobs_of(tc.forward(data, "cross_entropy").result())
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a, b)


def test_get_info_and_tokenizer_work_offline(service_client):
    tc = new_client(service_client, seed=0)
    info = tc.get_info()
    assert info.model_data.model_name == BASE_MODEL
    assert tc.model_id.endswith(":train:" + tc.model_id.rsplit(":", 1)[1])
    tokenizer = tc.get_tokenizer()
    assert tokenizer.decode(tokenizer.encode("What is 2 + 2?")) == "What is 2 + 2?"


def test_lora_options_are_honoured(service_client):
    """A LoRA on the MLP only must still learn; rank and seed come back in get_info."""
    tc = service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=4, seed=2, train_attn=False, train_unembed=False
    ).result()
    assert tc.get_info().lora_rank == 4
    data = sft_datums(tc.get_tokenizer())
    first = tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"]
    tc.optim_step(ADAM).result()
    second = tc.forward(data, "cross_entropy").result().metrics["loss:sum"]
    assert second < first
