"""The oldest SDK we claim (0.25, the version other open servers pin) still trains, samples, saves and loads
against this server. It runs in its own venv (`make sdk-compat`), as a user's old environment would."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from tests.integration.conftest import BASE_MODEL

ROOT = Path(__file__).resolve().parents[2]
OLDEST_SDK_PYTHON = ROOT / ".venv-sdk-0.25" / "bin" / "python"
SMOKE = ROOT / "tests" / "compat" / "sdk_smoke.py"


def run_smoke(python: Path, base_url: str) -> dict:
    assert python.exists(), f"{python} is missing: run `make sdk-compat` (make test does)"
    done = subprocess.run(
        [str(python), str(SMOKE), base_url, BASE_MODEL],
        capture_output=True,
        text=True,
        timeout=600,
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, f"the SDK smoke failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def check_smoke(seen: dict, version_prefix: str) -> None:
    print(f"SDK {seen['sdk_version']} smoke: losses {seen['losses']}, trained {seen['trained_loss']}")
    assert seen["sdk_version"].startswith(version_prefix), seen
    assert seen["trained_loss"] < seen["losses"][0] - 0.05, seen  # it learns
    assert abs(seen["restored_loss"] - seen["trained_loss"]) < 1e-4, seen  # the saved state is the trained one
    assert len(seen["sampled"]) == 2 and all(1 <= len(tokens) <= 6 for tokens in seen["sampled"]), seen  # EOS stops


def test_oldest_supported_sdk_trains_samples_saves_and_loads(base_url: str) -> None:
    check_smoke(run_smoke(OLDEST_SDK_PYTHON, base_url), "0.25.")


def test_installed_sdk_runs_the_same_smoke(base_url: str) -> None:
    check_smoke(run_smoke(Path(sys.executable), base_url), "0.38.")
