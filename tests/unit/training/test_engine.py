"""TrainingEngine on the real tiny model: exact logprobs, seeding, training, isolation, clipping, sharding."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from app.errors import NotFound
from app.messages import AdamParams, AdapterSpec
from app.training.base_model import load_base_model
from app.training.engine import TrainingEngine
from app.training_data.batch import PackedBatch
from app.training_data.sharding import merge_shards
from tests.conftest import TINY_MODEL
from tests.tolerances import assert_sums_close, network_terms
from tests.unit.training.custom_loss_graphs import program

VOCAB = 2048
SPEC = AdapterSpec(rank=8, seed=1234)


def _base() -> torch.nn.Module:
    return load_base_model(str(TINY_MODEL))


@pytest.fixture(scope="module")
def engine() -> TrainingEngine:
    return TrainingEngine(_base())


@pytest.fixture(scope="module")
def reference() -> torch.nn.Module:
    """An untouched copy of the base model (AdapterPool wraps its base in place)."""
    return _base()


def make_batch(lengths: list[int], *, k: int | None = None, seed: int = 0) -> PackedBatch:
    rng = np.random.default_rng(seed)
    total = sum(lengths)
    shape = (total,) if k is None else (total, k)
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    return PackedBatch(
        tokens=rng.integers(3, VOCAB, total, dtype=np.int64),
        offsets=offsets,
        loss_inputs={
            "target_tokens": rng.integers(3, VOCAB, shape, dtype=np.int64),
            "weights": rng.uniform(0.1, 2.0, shape).astype(np.float32),
        },
    )


def reference_logprobs(model: torch.nn.Module, batch: PackedBatch) -> np.ndarray:
    """Each datum alone through the base model; log_softmax gathered at the targets."""
    out = []
    with torch.no_grad():
        for i in range(batch.num_datums):
            s = batch.datum_slice(i)
            logits = model(input_ids=torch.from_numpy(batch.tokens[s])[None]).logits[0]
            lp = torch.log_softmax(logits.double(), dim=-1)
            targets = torch.from_numpy(batch.loss_inputs["target_tokens"][s])
            out.append(lp.gather(1, targets) if targets.dim() == 2 else lp.gather(1, targets[:, None])[:, 0])
    return torch.cat(out).numpy()


# our float32 passes against the float64 reference or each other: a forward pass's float32 sums (tests/tolerances.py)
TERMS = network_terms(TINY_MODEL)


def forward(engine: TrainingEngine, model_id: str, batch: PackedBatch, forward_only: bool = True):
    return engine.forward_backward(model_id, "cross_entropy", {}, batch, forward_only=forward_only)


def normalized_state(engine: TrainingEngine, model_id: str) -> dict[str, torch.Tensor]:
    return {re.sub(r"\.m\d+\.", ".ADAPTER.", k): v for k, v in engine.adapter_state(model_id).items()}


def test_fresh_adapter_matches_base_model(engine: TrainingEngine, reference: torch.nn.Module) -> None:
    engine.create_model("fresh", SPEC)
    batch = make_batch([5, 9, 3])
    out = forward(engine, "fresh", batch)
    expected = reference_logprobs(reference, batch)
    assert_sums_close(out.outputs["logprobs"], expected, TERMS, np.float32)
    assert out.outputs["logprobs"].shape == (17,)
    w = batch.loss_inputs["weights"]
    assert out.loss_sum == pytest.approx(float(-(w * expected).sum()), rel=1e-5)
    assert_sums_close(out.outputs["elementwise_loss"], -w * expected, TERMS, np.float32)
    assert out.datum_indices.tolist() == [0, 1, 2]


def test_two_dimensional_targets(engine: TrainingEngine, reference: torch.nn.Module) -> None:
    engine.create_model("soft", SPEC)
    batch = make_batch([4, 6], k=3, seed=1)
    out = forward(engine, "soft", batch)
    assert out.outputs["logprobs"].shape == (10, 3)
    expected = reference_logprobs(reference, batch)
    assert_sums_close(out.outputs["logprobs"], expected, TERMS, np.float32)
    w = batch.loss_inputs["weights"]
    assert out.loss_sum == pytest.approx(float(-(w * expected).sum()), rel=1e-5)


def test_seeding(engine: TrainingEngine) -> None:
    engine.create_model("seed-a", AdapterSpec(rank=4, seed=7))
    engine.create_model("seed-b", AdapterSpec(rank=4, seed=7))
    engine.create_model("seed-c", AdapterSpec(rank=4, seed=8))
    a, b, c = (normalized_state(engine, m) for m in ("seed-a", "seed-b", "seed-c"))
    assert a.keys() == b.keys() == c.keys() and len(a) > 0
    assert any("q_proj" in k for k in a) and any("down_proj" in k for k in a)
    assert not any("lm_head" in k for k in a)  # vLLM samplers refuse lm_head LoRAs
    assert all(torch.equal(a[k], b[k]) for k in a)  # exact: the same seed draws the same bytes
    assert not all(torch.equal(a[k], c[k]) for k in a if "lora_A" in k)
    assert all(torch.count_nonzero(v) == 0 for k, v in a.items() if "lora_B" in k)


def test_training_reduces_loss_and_leaves_other_adapters_alone(engine: TrainingEngine) -> None:
    engine.create_model("train-a", SPEC)
    engine.create_model("train-b", SPEC)
    batch = make_batch([6, 8], seed=2)
    b_before = forward(engine, "train-b", batch).outputs["logprobs"]
    losses = []
    for _ in range(15):
        losses.append(forward(engine, "train-a", batch, forward_only=False).loss_sum)
        engine.optim_step("train-a", AdamParams(learning_rate=1e-2))
    final = forward(engine, "train-a", batch).loss_sum
    assert final < 0.8 * losses[0]  # random targets on a random model: slow, but clearly falling
    # exact: train-b's weights are untouched, and the same pass over the same bytes is the same arithmetic
    np.testing.assert_array_equal(forward(engine, "train-b", batch).outputs["logprobs"], b_before)


def test_forward_only_leaves_no_gradients(engine: TrainingEngine) -> None:
    engine.create_model("frozen", SPEC)
    batch = make_batch([7], seed=3)
    before = engine.adapter_state("frozen")
    forward(engine, "frozen", batch)
    forward(engine, "frozen", batch)
    assert all(p.grad is None for p in engine.loaded("frozen").params)
    metrics = engine.optim_step("frozen", AdamParams(learning_rate=1e-1, weight_decay=0.0))
    assert metrics == {"grad_norm:mean": 0.0}
    after = engine.adapter_state("frozen")
    assert all(torch.equal(before[k], after[k]) for k in before)


def _exp_avg_norm(engine: TrainingEngine, model_id: str) -> float:
    opt = engine.loaded(model_id).optimizer
    return float(
        torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(s["exp_avg"]) for s in opt.state.values()]))
    )


def test_grad_clip_norm(engine: TrainingEngine) -> None:
    batch = make_batch([6, 5], seed=4)
    norms = {}
    for model_id, clip in (("clipped", 0.5), ("unclipped", 0.0)):
        engine.create_model(model_id, SPEC)
        forward(engine, model_id, batch, forward_only=False)
        norms[model_id] = engine.optim_step(model_id, AdamParams(learning_rate=1e-3, grad_clip_norm=clip))
    # Both report the same pre-clip norm, well above the clip.
    pre = norms["unclipped"]["grad_norm:mean"]
    assert pre > 0.5
    assert norms["clipped"]["grad_norm:mean"] == pytest.approx(pre, rel=1e-5)
    # Adam's first moment after one step is (1 - beta1) * grad: the clipped grad had norm 0.5.
    assert _exp_avg_norm(engine, "clipped") == pytest.approx(0.1 * 0.5, rel=1e-4)
    assert _exp_avg_norm(engine, "unclipped") == pytest.approx(0.1 * pre, rel=1e-4)


def test_sharding_matches_single_rank(engine: TrainingEngine) -> None:
    ranks = [TrainingEngine(_base(), rank=r, world_size=2) for r in (0, 1)]
    for e in (engine, *ranks):
        e.create_model("sharded", SPEC)
    rank_states = [normalized_state(e, "sharded") for e in ranks]
    assert all(torch.equal(rank_states[0][k], rank_states[1][k]) for k in rank_states[0])  # exact: the same seed

    batch = make_batch([3, 7, 2, 5, 4], k=None, seed=5)
    single = merge_shards(batch.offsets, [forward(engine, "sharded", batch)])
    shards = [forward(e, "sharded", batch) for e in ranks]
    assert shards[0].datum_indices.tolist() == [0, 2, 4]
    assert shards[1].datum_indices.tolist() == [1, 3]
    merged = merge_shards(batch.offsets, shards)
    for name in ("logprobs", "elementwise_loss"):
        assert_sums_close(merged.outputs[name], single.outputs[name], TERMS, err_msg=name)
    assert merged.metrics["loss:sum"] == pytest.approx(single.metrics["loss:sum"], rel=1e-5)

    one = make_batch([4], seed=6)  # rank 1 gets nothing
    empty = forward(ranks[1], "sharded", one)
    assert empty.outputs == {} and empty.loss_sum == 0.0
    merged_one = merge_shards(one.offsets, [forward(ranks[0], "sharded", one), empty])
    assert_sums_close(merged_one.outputs["logprobs"], forward(engine, "sharded", one).outputs["logprobs"], TERMS)


def test_unknown_model(engine: TrainingEngine) -> None:
    with pytest.raises(NotFound) as info:
        forward(engine, "never-created", make_batch([2]))
    assert info.value.field == "model_id"
    with pytest.raises(NotFound):
        engine.optim_step("never-created", AdamParams())


def test_remove_and_recreate(engine: TrainingEngine) -> None:
    engine.create_model("gone", SPEC)
    engine.create_model("gone", AdapterSpec(rank=2, seed=1))  # a retried create keeps the first adapter
    assert all(v.shape[0] == 8 for k, v in engine.adapter_state("gone").items() if "lora_A" in k)
    engine.remove_model("gone")
    with pytest.raises(NotFound):
        engine.require_model("gone")
    with pytest.raises(NotFound):
        forward(engine, "gone", make_batch([2]))


def test_save_adapter_writes_a_loadable_peft_directory_on_rank_zero_only(tmp_path) -> None:
    from peft import PeftModel

    from app.messages import CommandError, SaveCommand, WorkerCommand
    from app.ranks.execute import execute as execute_with
    from app.ranks.snapshots import SnapshotWriter
    from app.storage.objects import ObjectStorage

    storage = ObjectStorage(str(tmp_path))
    snapshots = SnapshotWriter(storage)

    def execute(engine: TrainingEngine, storage: ObjectStorage, cmd: WorkerCommand) -> object:
        return execute_with(engine, storage, snapshots, cmd)

    rank0 = TrainingEngine(load_base_model(str(TINY_MODEL)), rank=0, world_size=2)
    rank1 = TrainingEngine(load_base_model(str(TINY_MODEL)), rank=1, world_size=2)
    for engine in (rank0, rank1):
        engine.create_model("m", AdapterSpec(rank=4, seed=3))
    save = SaveCommand("m", "m/sampler_weights/s/v1", "adapter")
    assert execute(rank1, storage, save) == 0
    assert not (tmp_path / "m").exists()
    size = execute(rank0, storage, save)
    saved_dir = tmp_path / "m" / "sampler_weights" / "s" / "v1"
    assert sorted(p.name for p in saved_dir.iterdir()) == ["adapter_config.json", "adapter_model.safetensors"]
    assert size == sum(p.stat().st_size for p in saved_dir.iterdir())
    assert [p.name for p in saved_dir.parent.iterdir()] == ["v1"]  # no temp leftovers
    missing = execute(rank1, storage, SaveCommand("other", "other/x/v1", "adapter"))
    assert isinstance(missing, CommandError) and missing.error["field"] == "model_id"
    reloaded = PeftModel.from_pretrained(load_base_model(str(TINY_MODEL)), str(saved_dir))
    saved = {n.replace(".default.", "."): p for n, p in reloaded.named_parameters() if "lora_" in n}
    ours = {n.replace(".m0.", "."): p for n, p in rank0.pool.model.named_parameters() if ".m0." in n}
    assert saved.keys() == ours.keys()
    for name, param in ours.items():
        assert torch.equal(saved[name], param)  # exact: the file holds the tensors' bytes


def test_a_snapshot_is_a_copy_that_resumes_training_exactly(tmp_path) -> None:
    """Rank 0 writes the snapshot on a thread while training goes on; loaded into a fresh engine, the same next
    step gives bit-identical weights (what rebuilding a lost model relies on)."""
    from app.messages import SnapshotCommand
    from app.ranks.execute import execute
    from app.ranks.snapshots import SnapshotWriter
    from app.storage.objects import ObjectStorage

    storage = ObjectStorage(str(tmp_path / "store"))
    writer = SnapshotWriter(storage)
    batch = make_batch([6, 8], seed=4)
    live = TrainingEngine(load_base_model(str(TINY_MODEL)))
    live.create_model("m", SPEC)

    def step(engine: TrainingEngine) -> None:
        forward(engine, "m", batch, forward_only=False)
        engine.optim_step("m", AdamParams(learning_rate=1e-2))

    step(live)
    step(live)
    assert execute(live, storage, writer, SnapshotCommand("m", "m/snapshots/2")) is None
    step(live)  # changes the live tensors while the snapshot may still be being written
    writer.flush()

    rebuilt = TrainingEngine(load_base_model(str(TINY_MODEL)))
    rebuilt.create_model("m", SPEC)
    rebuilt.load_state("m", storage.fetch("m/snapshots/2", tmp_path / "cache"), with_optimizer=True)
    step(rebuilt)
    expected, got = live.adapter_state("m"), rebuilt.adapter_state("m")
    assert expected.keys() == got.keys()
    assert all(torch.equal(expected[k], got[k]) for k in expected)


def test_a_custom_losss_compute_is_reported_as_its_fair_share_cost(engine: TrainingEngine) -> None:
    """What a custom loss computes beyond the model's pass comes back in tokens of the base's training (the trainer
    debits it in the fair share); a matmul-heavy loss costs more than an element-wise one, a built-in loss nothing."""

    def weighted(logprobs, advantages):  # type: ignore[no-untyped-def]
        return -(logprobs * advantages).sum(), {}

    def outer(logprobs, advantages):  # type: ignore[no-untyped-def]
        return (torch.outer(logprobs, logprobs) @ torch.outer(advantages, advantages)).sum(), {}

    engine.create_model("cost", SPEC)
    batch = make_batch([256, 256, 256, 256])
    batch = PackedBatch(batch.tokens, batch.offsets, {**batch.loss_inputs, "advantages": batch.loss_inputs["weights"]})
    ranks = {"logprobs": 1, "advantages": 1}
    light = engine.forward_backward("cost", "custom", {}, batch, True, program(weighted, ranks))
    heavy = engine.forward_backward("cost", "custom", {}, batch, True, program(outer, ranks))
    assert engine.forward_backward("cost", "cross_entropy", {}, batch, True).loss_cost_tokens == 0
    assert 0 <= light.loss_cost_tokens < heavy.loss_cost_tokens
    flops = 4 * 2 * 256**3  # each datum's [256, 256] @ [256, 256], as torch counts it (~40 tokens of training)
    assert heavy.loss_cost_tokens == pytest.approx(flops / (6 * sum(p.numel() for p in _base().parameters())), rel=0.5)
