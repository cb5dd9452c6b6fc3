"""The torch function behind each loss of the registry (app.training_data.losses), looked up by name."""

from __future__ import annotations

from collections.abc import Callable

import torch

from app.training.losses.cross_entropy import cross_entropy
from app.training.losses.policy_gradient import cispo, dro, gspo, importance_sampling, ppo
from app.training.losses.stable_reinforce import stable_reinforce, stable_reinforce_stats
from app.training.losses.value import ppo_critic

# (the model's prediction: target logprobs [T] or [T, K] for a policy, values [T] for a critic;
#  loss inputs by name, config, datum index of each token [T])
#   -> (summed loss, elementwise loss [T] or [T, K])
LossFn = Callable[
    [torch.Tensor, dict[str, torch.Tensor], dict[str, float], torch.Tensor], tuple[torch.Tensor, torch.Tensor]
]

LOSS_FUNCTIONS: dict[str, LossFn] = {
    "cross_entropy": cross_entropy,
    "importance_sampling": importance_sampling,
    "ppo": ppo,
    "cispo": cispo,
    "dro": dro,
    "gspo": gspo,
    "ppo_critic": ppo_critic,
    "stable_reinforce": stable_reinforce,
}

# Per-rank statistics a loss reports besides its sum: name -> (sum, count), merged across ranks into sum / count.
StatsFn = Callable[[torch.Tensor, dict[str, torch.Tensor], dict[str, float]], dict[str, tuple[float, float]]]
LOSS_STATS: dict[str, StatsFn] = {"stable_reinforce": stable_reinforce_stats}
