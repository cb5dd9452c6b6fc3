"""The Dimuon optimizer through the real SDK: chosen at creation, reported by get_info, stepped by DimuonParams."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from tests.integration.helpers import logprobs_of, sft_datums


def test_a_dimuon_model_steps_with_dimuon_params_only(service_client):  # type: ignore[no-untyped-def]
    tc = service_client.create_lora_training_client(
        base_model="tinker-serve/tiny", rank=8, seed=61, optimizer=types.DimuonOptimizerConfig()
    ).result()
    reported = tc.get_info().optimizer_config  # the SDK parses a non-Adam config as its base class
    assert reported.model_dump() == types.DimuonOptimizerConfig().model_dump()
    data = sft_datums(tc.get_tokenizer(), 3)
    losses = []
    for _ in range(3):
        losses.append(tc.forward_backward(data, "cross_entropy").result().metrics["loss:sum"])
        metrics = tc.optim_step(types.DimuonParams(learning_rate=0.02)).result().metrics
        assert metrics["grad_norm:mean"] > 0
    after = tc.forward(data, "cross_entropy").result()
    assert (
        float(sum(-(lp * d.loss_fn_inputs["weights"].to_numpy()).sum() for lp, d in zip(logprobs_of(after), data)))
        < losses[0]
    )
    with pytest.raises(tinker.RequestFailedError, match="created with dimuon"):
        tc.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    adam = service_client.create_lora_training_client(base_model="tinker-serve/tiny", rank=8, seed=62).result()
    adam.forward_backward(data, "cross_entropy").result()
    with pytest.raises(tinker.RequestFailedError, match="created with adamw"):
        adam.optim_step(types.DimuonParams(learning_rate=0.02)).result()
    assert np.isfinite(losses).all()
