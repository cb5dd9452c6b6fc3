"""Architecture rules: app/ never imports Ray Serve; the ingress loads no training or vLLM stack; routers raise
errors instead of writing HTTP statuses; no module grows past 400 lines."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 400


def _modules(*dirs: str) -> list[Path]:
    return sorted(p for d in dirs for p in (ROOT / d).rglob("*.py"))


def serve_imports(source: str) -> list[str]:
    """Every import of ray.serve in `source`, in any spelling."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name == "ray.serve" or a.name.startswith("ray.serve.")]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module == "ray.serve" or node.module.startswith("ray.serve."):
                found.append(node.module)
            elif node.module == "ray":
                found += [f"ray.{a.name}" for a in node.names if a.name == "serve"]
    return found


@pytest.mark.parametrize(
    "source",
    [
        "import ray.serve",
        "import ray.serve.handle as h",
        "from ray import serve",
        "from ray.serve import deployment",
        "def f():\n    from ray.serve.handle import X",
    ],
)
def test_detector_catches_every_spelling(source: str) -> None:
    assert serve_imports(source)


def test_detector_allows_ray_core_and_train() -> None:
    assert (
        serve_imports(
            "import ray\nimport ray.train\nfrom ray.train.torch import TorchTrainer\n"
            "from ray import train\nimport serve"
        )
        == []
    )


def test_app_does_not_import_ray_serve() -> None:
    modules = _modules("app")
    assert len(modules) > 20
    offenders = {str(p.relative_to(ROOT)): found for p in modules if (found := serve_imports(p.read_text()))}
    assert offenders == {}


def test_modules_stay_small() -> None:
    modules = _modules("app", "deployments")
    assert any(p.parts[-2] == "deployments" for p in modules)
    too_long = {str(p.relative_to(ROOT)): n for p in modules if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert too_long == {}


HEAVY = ("torch", "transformers", "peft", "vllm", "ray.train")


def test_ingress_loads_no_training_or_vllm_stack() -> None:
    """In a fresh interpreter, importing the ingress deployment (and the whole API) loads none of HEAVY."""
    probe = (
        "import json, sys\nimport deployments.ingress, app.api.main\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert json.loads(out.stdout.splitlines()[-1]) == []


def test_heavy_probe_sees_a_heavy_import() -> None:
    probe = (
        f"import json, sys\nimport app.training.engine\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True
    )
    assert "torch" in json.loads(out.stdout.splitlines()[-1])


def inline_statuses(source: str) -> list[str]:
    """HTTP statuses a router writes itself: a `status_code=` keyword, a JSONResponse/Response built with a
    status, or an HTTPException."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.keyword) and node.arg == "status_code":
            found.append(f"line {node.value.lineno}: status_code=")
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name == "HTTPException" or (name.endswith("Response") and len(node.args) > 1):
                found.append(f"line {node.lineno}: {name}")
    return found


@pytest.mark.parametrize(
    "source",
    ["JSONResponse({}, status_code=404)", "JSONResponse({}, 410)", "raise HTTPException(404)", "Response(b'', 503)"],
)
def test_status_detector_catches_every_spelling(source: str) -> None:
    assert inline_statuses(source)


def test_routers_write_no_http_status() -> None:
    """Every status comes from app.api.errors, the one mapper."""
    routers = [p for p in _modules("app/api") if p.name != "errors.py"]
    assert len(routers) > 10
    offenders = {str(p.relative_to(ROOT)): found for p in routers if (found := inline_statuses(p.read_text()))}
    assert offenders == {}


def test_test_module_names_are_unique() -> None:
    """The test folders are not packages: pytest imports two modules with one basename as one, and stops."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) > 30
    assert sorted({n for n in names if names.count(n) > 1}) == []
