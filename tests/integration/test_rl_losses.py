"""Every RL loss through the SDK: loss:sum equals its formula on the same call's logprobs and inputs."""

from __future__ import annotations

import numpy as np
import pytest
import tinker
from tinker import types

from tests.integration.helpers import SENTENCES, logprobs_of, new_client, sft_datums


def rl_datums(tokenizer, rng: np.random.Generator) -> list[types.Datum]:
    datums = []
    for text in SENTENCES[:3]:
        ids = tokenizer.encode(text)
        n = len(ids) - 1
        datums.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={
                    "target_tokens": ids[1:],
                    "logprobs": (-7.6 + rng.normal(0, 0.5, n)).tolist(),
                    "advantages": rng.normal(0, 1, n).tolist(),
                    "sequence_ratio_mask": (rng.random(n) > 0.3).astype(float).tolist(),
                },
            )
        )
    return datums


def expected_loss(name: str, config: dict, datum: types.Datum, lp: np.ndarray) -> float:
    q = datum.loss_fn_inputs["logprobs"].to_numpy().astype(np.float64)
    a = datum.loss_fn_inputs["advantages"].to_numpy().astype(np.float64)
    lp = lp.astype(np.float64)
    r = np.exp(lp - q)
    if name == "importance_sampling":
        return float(-(r * a).sum())
    if name == "ppo":
        lo, hi = config.get("clip_low_threshold", 0.8), config.get("clip_high_threshold", 1.2)
        return float(-np.minimum(r * a, np.clip(r, lo, hi) * a).sum())
    if name == "cispo":
        return float(-(np.clip(r, 0.0, 4.0) * lp * a).sum())
    if name == "dro":
        return float(-(lp * a - 0.5 * config["beta"] * (lp - q) ** 2).sum())
    mask = datum.loss_fn_inputs["sequence_ratio_mask"].to_numpy() != 0  # gspo
    s = np.exp((lp - q)[mask].mean()) if mask.any() else 1.0
    return float(-np.minimum(s * a, np.clip(s, 1 - 3e-4, 1 + 4e-4) * a).sum())


@pytest.mark.parametrize(
    "name, config",
    [
        ("importance_sampling", {}),
        ("ppo", {}),
        ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}),
        ("cispo", {}),
        ("dro", {"beta": 0.05}),
        ("gspo", {}),
    ],
)
def test_loss_sum_matches_formula(service_client, name, config):
    tc = new_client(service_client, seed=31)
    data = rl_datums(tc.get_tokenizer(), np.random.default_rng(0))
    if name != "gspo":
        data = [
            types.Datum(
                model_input=d.model_input,
                loss_fn_inputs={k: v for k, v in d.loss_fn_inputs.items() if k != "sequence_ratio_mask"},
            )
            for d in data
        ]
    result = tc.forward_backward(data, name, loss_fn_config=config or None).result()
    expected = sum(
        expected_loss(name, config, d, out["logprobs"].to_numpy()) for d, out in zip(data, result.loss_fn_outputs)
    )
    assert result.metrics["loss:sum"] == pytest.approx(expected, rel=1e-4, abs=1e-4)


def test_stable_reinforce_without_provenance_and_bad_rl_config_are_user_errors(service_client):
    tc = new_client(service_client, seed=32)
    (datum,) = rl_datums(tc.get_tokenizer(), np.random.default_rng(1))[:1]
    inputs = {k: v for k, v in datum.loss_fn_inputs.items() if k != "sequence_ratio_mask"}  # only gspo reads it
    data = [types.Datum(model_input=datum.model_input, loss_fn_inputs=inputs)]
    for loss, config, field in (
        ("stable_reinforce", None, "loss_fn_input_spans"),
        ("ppo", {"epsilon": 0.2}, "loss_fn_config"),
    ):
        with pytest.raises(tinker.RequestFailedError, match=field):
            tc.forward_backward(data, loss, loss_fn_config=config).result()


def test_forward_backward_custom_trains_like_its_builtin_twin(service_client):
    """The SDK's client-side custom loss (a forward, then cross_entropy with weights -dL/dlogprob): a custom
    weighted negative log-likelihood must report its own value and take the very step cross_entropy takes."""
    import torch

    custom_client, builtin_client = new_client(service_client, seed=33), new_client(service_client, seed=33)
    data = sft_datums(custom_client.get_tokenizer(), 3)

    def weighted_nll(batch: list[types.Datum], logprobs: list[torch.Tensor]) -> tuple[torch.Tensor, dict[str, float]]:
        loss = sum(-(lp * torch.tensor(d.loss_fn_inputs["weights"].data)).sum() for d, lp in zip(batch, logprobs))
        return loss, {"custom_metric:sum": 1.0}

    custom = custom_client.forward_backward_custom(data, weighted_nll).result()
    builtin = builtin_client.forward_backward(data, "cross_entropy").result()
    assert custom.metrics["loss:sum"] == pytest.approx(builtin.metrics["loss:sum"], rel=1e-5)
    assert custom.metrics["custom_metric:sum"] == 1.0
    for client in (custom_client, builtin_client):
        client.optim_step(types.AdamParams(learning_rate=1e-2)).result()
    after = [logprobs_of(c.forward(data, "cross_entropy").result()) for c in (custom_client, builtin_client)]
    before = logprobs_of(custom)
    for a, b, first in zip(*after, before):
        np.testing.assert_allclose(a, b, atol=1e-5)
        assert np.abs(a - first).max() > 1e-3  # the step moved the model
