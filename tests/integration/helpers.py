"""Datums and reference computations shared by the integration tests."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import httpx
import numpy as np
import tinker
import torch
from peft import PeftModel
from tinker import types

from app.messages import AdamParams, AdapterSpec
from app.storage.paths import parse_tinker_path
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from tests.conftest import TINY_MODEL

SENTENCES = [
    "What is 12 + 7? The answer is 19.",
    "What is 3 + 4? The answer is 7.",
    "The cat sat on the mat near the door.",
    "What is 20 + 22? The answer is 42.",
    "A small dog ran to the park today.",
    "What is 9 + 9? The answer is 18.",
    "Birds sing in the morning light.",
    "What is 5 + 6? The answer is 11.",
]


def sft_datums(tokenizer, count: int = 4) -> list[types.Datum]:
    """Next-token datums; weights 0 on the first two targets (a 'prompt'), 1 after."""
    datums = []
    for text in SENTENCES[:count]:
        ids = tokenizer.encode(text)
        weights = [0.0, 0.0] + [1.0] * (len(ids) - 3)
        datums.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": weights},
            )
        )
    return datums


def random_datums(count: int, length: int, seed: int) -> list[types.Datum]:
    """`count` next-token datums of `length` random tokens (ids 3..2047, every model's vocabulary holds them)."""
    rng = np.random.default_rng(seed)
    datums = []
    for _ in range(count):
        ids = rng.integers(3, 2048, length + 1).tolist()
        datums.append(
            types.Datum(
                model_input=types.ModelInput.from_ints(ids[:-1]),
                loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * length},
            )
        )
    return datums


def packed(datums: list[types.Datum]) -> PackedBatch:
    """The same datums as the server packs them, for the in-process reference engine."""
    tokens = [np.array(d.model_input.to_ints(), dtype=np.int64) for d in datums]
    offsets = np.concatenate([[0], np.cumsum([len(t) for t in tokens])]).astype(np.int64)
    inputs = {
        "target_tokens": np.concatenate([np.asarray(d.loss_fn_inputs["target_tokens"].data, np.int64) for d in datums]),
        "weights": np.concatenate([np.asarray(d.loss_fn_inputs["weights"].data, np.float32) for d in datums]),
    }
    return PackedBatch(np.concatenate(tokens), offsets, inputs)


def logprobs_of(result: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [np.asarray(out["logprobs"].to_numpy()) for out in result.loss_fn_outputs]


def reference_run(base: torch.nn.Module, seed: int, rank: int, batch: PackedBatch, steps: int, lr: float) -> np.ndarray:
    """Train `steps` steps in this process (one worker, no Ray), then return the forward logprobs."""
    engine = TrainingEngine(base)
    engine.create_model("ref", AdapterSpec(rank=rank, seed=seed))
    try:
        for _ in range(steps):
            engine.forward_backward("ref", "cross_entropy", {}, batch, forward_only=False)
            engine.optim_step("ref", AdamParams(learning_rate=lr))
        return engine.forward_backward("ref", "cross_entropy", {}, batch, forward_only=True).outputs["logprobs"]
    finally:
        engine.remove_model("ref")


def train_steps(tc: tinker.TrainingClient, data: list[types.Datum], steps: int, lr: float = 1e-2) -> None:
    """`steps` sequential forward_backward + optim_step, each awaited before the next."""
    for _ in range(steps):
        tc.forward_backward(data, "cross_entropy").result()
        tc.optim_step(types.AdamParams(learning_rate=lr)).result()


def trainer_logprobs(tc: tinker.TrainingClient, tokens: list[int]) -> np.ndarray:
    """The trainer's forward logprobs of tokens[1:] given their prefixes."""
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)},
    )
    return tc.forward([datum], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].to_numpy()


def new_client(service_client: tinker.ServiceClient, seed: int, rank: int = 8) -> tinker.TrainingClient:
    return service_client.create_lora_training_client(base_model="tinker-serve/tiny", rank=rank, seed=seed).result()


def critic_datums(tokenizer, values: list[np.ndarray] | None = None) -> list[types.Datum]:
    """Four sentences; with `values`, the value loss's inputs: returns +1 on even token ids, -1 on odd ones."""
    datums = []
    for i, text in enumerate(SENTENCES[:4]):
        ids = np.asarray(tokenizer.encode(text)[:-1], dtype=np.int64)
        inputs = {} if values is None else {"values": values[i].astype(np.float32), "returns": parity_returns(ids)}
        datums.append(types.Datum(model_input=types.ModelInput.from_ints(ids.tolist()), loss_fn_inputs=inputs))
    return datums


def parity_returns(ids: np.ndarray) -> np.ndarray:
    return np.where(ids % 2 == 0, 1.0, -1.0).astype(np.float32)


def values_of(result: types.ForwardBackwardOutput) -> list[np.ndarray]:
    return [np.asarray(out["values"].to_numpy()) for out in result.loss_fn_outputs]


def stored_directory(state_dir: Path, uri: str) -> Path:
    """Where the checkpoint at `uri` lives in the default local storage (read from the SQLite file)."""
    path = parse_tinker_path(uri)
    with sqlite3.connect(state_dir / "tinker_serve.db") as db:
        (location,) = db.execute(
            "SELECT location FROM checkpoints WHERE model_id = ? AND kind = ? AND name = ?",
            (path.model_id, path.kind, path.name),
        ).fetchone()
    return state_dir / "checkpoints" / location


def raw_client(base_url: str, key: str) -> httpx.Client:
    """Plain HTTP to the server as the user of `key`."""
    return httpx.Client(base_url=base_url, timeout=60, headers={"X-API-Key": key})


def future_result(http: httpx.Client, request_id: str, timeout_s: float = 120) -> dict:
    """Long-poll retrieve_future until the future finishes: its JSON result or error."""
    deadline = time.monotonic() + timeout_s
    while (body := http.post("/api/v1/retrieve_future", json={"request_id": request_id}).json()).get(
        "type"
    ) == "try_again":
        assert time.monotonic() < deadline, body
    return body


def raw_session_with_model(http: httpx.Client, base_model: str) -> tuple[str, str]:
    """A raw session (it never heartbeats) holding one created model of `base_model`: (session id, model id)."""
    session = http.post("/api/v1/create_session", json={}).json()["session_id"]
    created = http.post(
        "/api/v1/create_model",
        json={"session_id": session, "model_seq_id": 0, "base_model": base_model, "lora_config": {"rank": 4}},
    ).json()
    assert future_result(http, created["request_id"])["model_id"] == created["model_id"]
    return session, created["model_id"]


def peft_logprobs(adapter_dir: Path, data: list[types.Datum]) -> np.ndarray:
    """The logprobs of `data`'s targets under the adapter at `adapter_dir` loaded by plain PEFT on the tiny base."""
    model = PeftModel.from_pretrained(load_base_model(str(TINY_MODEL)), str(adapter_dir)).eval()
    batch = packed(data)
    out = []
    with torch.no_grad():
        for i in range(batch.num_datums):
            ids = torch.from_numpy(batch.tokens[batch.datum_slice(i)])[None]
            lp = torch.log_softmax(model(input_ids=ids).logits[0].float(), -1)
            targets = torch.from_numpy(batch.loss_inputs["target_tokens"][batch.datum_slice(i)])
            out.append(lp.gather(1, targets[:, None]).squeeze(1).numpy())
    return np.concatenate(out)
