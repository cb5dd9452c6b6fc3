"""Custom Prometheus metrics (app/metrics.py) reach Ray's metrics endpoint with plausible values after a few
real requests: routes by status, queue depth (its models summed: per-model labels are off by default),
training-operation latency, tokens trained and sampled, adapter loads, requests of all users (no user named);
and Serve's own replica metrics beside them."""

from __future__ import annotations

import contextlib
import re
import time

import httpx
from tinker import types

from app.db.keys import enrolled_owner
from tests.integration.conftest import METRICS_PORT
from tests.integration.helpers import new_client, sft_datums, train_steps

API_KEY = "tml-integration-tests"  # the shared service_client's key
USER = enrolled_owner(API_KEY)


def _samples(text: str, name: str, **labels: str) -> list[float]:
    """Values of every series of `name` whose labels include `labels`."""
    found = []
    for line in text.splitlines():
        match = re.match(rf"^{name}(?:_total)?{{(.*)}} (\S+)$", line)
        if match and all(f'{k}="{v}"' in match.group(1) for k, v in labels.items()):
            found.append(float(match.group(2)))
    return found


def test_custom_metrics_reach_rays_metrics_endpoint(service_client) -> None:
    tc = new_client(service_client, seed=71)
    data = sft_datums(tc.get_tokenizer())
    trained_tokens = sum(len(d.model_input.to_ints()) for d in data)
    train_steps(tc, data, 2)
    sampler = tc.save_weights_and_get_sampling_client().result()
    prompt = types.ModelInput.from_ints(data[0].model_input.to_ints()[:5])
    sampler.sample(prompt, 2, types.SamplingParams(max_tokens=6, temperature=1.0, seed=1)).result()

    expectations = {
        "trained tokens": lambda t: sum(_samples(t, "ray_tinker_serve_tokens", kind="trained")) >= 2 * trained_tokens,
        "sampled tokens": lambda t: sum(_samples(t, "ray_tinker_serve_tokens", kind="sampled")) >= 12,
        "forward_backward answered 200": lambda t: (
            sum(_samples(t, "ray_tinker_serve_requests", route="/api/v1/forward_backward", status="200")) >= 2
        ),
        "optim_step latency": lambda t: (
            sum(_samples(t, "ray_tinker_serve_training_op_seconds_count", op="optim_step")) >= 2
        ),
        # per-model and per-user labels are off by default (metrics.per_model_labels, metrics.per_user_labels)
        "queue depth of the trainer's models": lambda t: bool(
            _samples(t, "ray_tinker_serve_queue_depth", model_id="all")
        ),
        "adapter loads": lambda t: sum(_samples(t, "ray_tinker_serve_adapter_loads")) >= 1,
        "the trainer's future writes": lambda t: (
            sum(_samples(t, "ray_tinker_serve_db_statements", process="trainer", statement="update futures")) >= 2
        ),
        "the ingress's journal appends": lambda t: (
            sum(_samples(t, "ray_tinker_serve_db_statements", process="ingress", statement="insert journal")) >= 2
        ),
        "Serve's replica metrics": lambda t: bool(_samples(t, "ray_serve_deployment_replica_healthy")),
        "requests of all users": lambda t: (
            sum(_samples(t, "ray_tinker_serve_user_requests", user="all", status="200")) >= 4
        ),
    }
    deadline, missing = time.monotonic() + 90, list(expectations)  # Ray exports every few seconds
    text = ""
    while missing and time.monotonic() < deadline:
        with contextlib.suppress(httpx.ConnectError):  # the node's metrics agent starts after the app can answer
            text = httpx.get(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10).text
        missing = [name for name, holds in expectations.items() if not holds(text)]
        time.sleep(2)
    assert not missing, f"not on the metrics endpoint (or implausible): {missing}"
    assert API_KEY not in text and USER not in text  # no user is named by default (nor ever by their key)
    latencies = _samples(text, "ray_tinker_serve_training_op_seconds_sum", op="forward_backward")
    assert latencies and 0 < sum(latencies) < 600
