"""A short end-to-end run through whichever tinker SDK runs this script: create a LoRA model, train it, sample
from it, save it and load it back. It imports nothing of the server's, so an old SDK in its own venv can run it.

    python tests/compat/sdk_smoke.py BASE_URL BASE_MODEL

Prints one JSON line of what it saw; exits nonzero (with the SDK's error) on any failure.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import tinker
from tinker import types

STEPS = 6
TOKENS = [[5, 9, 14, 3, 27, 8, 11, 40], [7, 7, 21, 2, 19, 33, 6, 12]]


def datums() -> list[types.Datum]:
    return [
        types.Datum(
            model_input=types.ModelInput.from_ints(ids[:-1]),
            loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * (len(ids) - 1)},
        )
        for ids in TOKENS
    ]


def mean_loss(result: types.ForwardBackwardOutput) -> float:
    logprobs = np.concatenate([np.asarray(out["logprobs"].tolist()) for out in result.loss_fn_outputs])
    return float(-logprobs.mean())


def main(base_url: str, base_model: str) -> dict:
    service = tinker.ServiceClient(base_url=base_url, api_key="tml-sdk-smoke")
    training = service.create_lora_training_client(base_model=base_model, rank=4, seed=0)
    losses = []
    for _ in range(STEPS):
        result = training.forward_backward(datums(), "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(mean_loss(result))
    trained = mean_loss(training.forward(datums(), "cross_entropy").result())

    sampler = training.save_weights_and_get_sampling_client(name="smoke")
    sample = sampler.sample(
        types.ModelInput.from_ints(TOKENS[0][:4]), num_samples=2, sampling_params=types.SamplingParams(max_tokens=6)
    ).result()

    state = training.save_state("smoke").result().path
    restored = service.create_training_client_from_state(state)
    restored_loss = mean_loss(restored.forward(datums(), "cross_entropy").result())
    return {
        "sdk_version": tinker.__version__,
        "losses": losses,
        "trained_loss": trained,
        "restored_loss": restored_loss,
        "sampled": [list(s.tokens) for s in sample.sequences],
        "state_path": state,
    }


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2])))
