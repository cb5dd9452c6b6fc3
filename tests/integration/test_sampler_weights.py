"""save_weights_for_sampler: the trainer writes a PEFT adapter directory, in seq_id order, that
reproduces the trainer's own logprobs when loaded by plain PEFT (what samplers will load by path)."""

from __future__ import annotations

import numpy as np
import pytest
import tinker

from tests.conftest import TINY_MODEL
from tests.integration.helpers import logprobs_of, new_client, peft_logprobs, sft_datums, stored_directory, train_steps
from tests.tolerances import assert_sums_close, network_terms


def test_saved_sampler_weights_reproduce_trainer_logprobs(service_client, state_dir):
    tc = new_client(service_client, seed=51)
    data = sft_datums(tc.get_tokenizer())
    train_steps(tc, data, 2)
    saved = tc.save_weights_for_sampler("after-2-steps")  # queued behind the steps, before the 3rd
    train_steps(tc, data, 1)
    uri = saved.result().path
    assert uri == f"tinker://{tc.model_id}/sampler_weights/after-2-steps"
    directory = stored_directory(state_dir, uri)
    assert (directory / "adapter_config.json").exists() and (directory / "adapter_model.safetensors").exists()

    fresh = new_client(service_client, seed=51)  # same seed, exactly 2 steps: what the save must hold
    train_steps(fresh, data, 2)
    expected = np.concatenate(logprobs_of(fresh.forward(data, "cross_entropy").result()))
    # PEFT's full logits against our blockwise ones: a forward pass's float32 sums in another order
    assert_sums_close(peft_logprobs(directory, data), expected, network_terms(TINY_MODEL), np.float32)


def test_bad_and_duplicate_names_fail_as_user_errors(service_client):
    tc = new_client(service_client, seed=52)
    tc.save_weights_for_sampler("twice").result()
    for name, expected in (("twice", "already exists"), ("no/slash", "checkpoint name 'no/slash'")):
        with pytest.raises(tinker.RequestFailedError) as info:
            tc.save_weights_for_sampler(name).result()
        assert info.value.category == tinker.types.RequestErrorCategory.User
        assert expected in info.value.message
