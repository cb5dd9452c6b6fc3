"""The whole app on PostgreSQL (runs last, on the session's last app: conftest's `families_on_postgres`, whose
`database_url` is a fresh database on the test session's own server, tests/postgres.py). The real SDK trains,
samples, saves and loads; every row lands in Postgres and no SQLite file is made."""

from __future__ import annotations

import asyncio

import numpy as np
import tinker
from sqlalchemy import func, select
from tinker import types

from app.db.schema import checkpoints, connect, training_runs
from tests.integration.helpers import logprobs_of, sft_datums


def _count_rows(url: str, model_id: str) -> tuple[int, int]:
    async def main() -> tuple[int, int]:
        db = connect(url)
        try:
            async with db.connect() as conn:
                runs = await conn.scalar(select(func.count()).where(training_runs.c.model_id == model_id))
                saved = await conn.scalar(select(func.count()).where(checkpoints.c.model_id == model_id))
                return int(runs or 0), int(saved or 0)
        finally:
            await db.dispose()

    return asyncio.run(main())


def test_train_sample_save_and_load_on_postgres(families_on_postgres: str, base_url: str) -> None:
    client = tinker.ServiceClient(base_url=base_url, api_key="tml-postgres-tests")
    try:
        tc = client.create_lora_training_client(base_model="tinker-serve/tiny-qwen3", rank=8, seed=71).result()
        data = sft_datums(tc.get_tokenizer())
        losses = []
        for _ in range(4):
            fb = tc.forward_backward(data, "cross_entropy")
            tc.optim_step(types.AdamParams(learning_rate=1e-2)).result()
            losses.append(fb.result().metrics["loss:sum"])
        print(f"\nloss on Postgres: {' -> '.join(f'{x:.2f}' for x in losses)}")
        assert losses[-1] < losses[0]

        sampler = tc.save_weights_and_get_sampling_client().result()
        prompt = types.ModelInput.from_ints(data[0].model_input.to_ints()[:6])
        out = sampler.sample(prompt, 2, types.SamplingParams(max_tokens=4, temperature=0.7, seed=0)).result()
        assert len(out.sequences) == 2 and all(1 <= len(s.tokens) <= 4 for s in out.sequences)

        state = tc.save_state("on-postgres").result().path
        expected = logprobs_of(tc.forward(data, "cross_entropy").result())
        restored = client.create_training_client_from_state_with_optimizer(state).result()
        for got, want in zip(logprobs_of(restored.forward(data, "cross_entropy").result()), expected, strict=True):
            np.testing.assert_array_equal(got, want)
        runs, saved = _count_rows(families_on_postgres, tc.model_id)
        assert runs == 1 and saved >= 1  # the run and its state, in Postgres
    finally:
        client.close("success").result()
