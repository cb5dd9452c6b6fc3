"""The Trainer replica builds its worker group's TorchTrainer without loading the ranks' modules (transformers, peft,
the command loop: ~3.6 s of CPU in every Trainer replica that starts, on 2 cores): the train function it hands Ray
Train is a light reference, and the ranks import their own modules."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
RANK_MODULES = ("transformers", "peft", "app.ranks.command_loop", "app.training.engine")

PROBE = f"""
import json, sys
import ray.cloudpickle as cloudpickle
from app.config import WorkerGroupConfig
from app.trainer.worker_group import RayTrainWorkerGroup
group = RayTrainWorkerGroup("t", "/nonexistent", WorkerGroupConfig(num_workers=2), sys.argv[1],
                            checkpoint_uri=sys.argv[1], command_timeout_s=1)
trainer = group.torch_trainer(mailbox=None)
shipped = cloudpickle.dumps(trainer.train_loop_per_worker)
print(json.dumps({{"loaded": [m for m in {RANK_MODULES!r} if m in sys.modules], "bytes": len(shipped),
                  "function": trainer.train_loop_per_worker.__module__}}))
"""


def test_the_trainer_replica_hands_ray_train_a_light_entry(tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-c", PROBE, str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=180, check=True
    )
    built = json.loads(out.stdout.splitlines()[-1])
    assert built["loaded"] == [], f"building the TorchTrainer loaded the ranks' modules: {built['loaded']}"
    assert built["function"] == "app.ranks.entry" and built["bytes"] < 1000, built  # pickled by reference
