"""Architecture rules: app/ never imports Ray Serve; the ingress loads no training or vLLM stack; what the ingress
shares with the trainer and the ranks (app/training_data, app/operations, app/messages) loads no torch; routers raise
errors instead of writing HTTP statuses. (Modules are kept small by concept, not by a line count.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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


HEAVY = ("torch", "transformers", "peft", "vllm", "ray.train")


@pytest.mark.parametrize(
    "imports",
    [
        "deployments.ingress, app.api.main",
        # what the ingress shares with the trainer and the ranks: every module of these packages
        ", ".join(
            ".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
            for p in _modules("app/training_data", "app/operations")
        )
        + ", app.messages",
    ],
    ids=["ingress", "shared"],
)
def test_ingress_loads_no_training_or_vllm_stack(imports: str) -> None:
    """In a fresh interpreter, importing the ingress deployment (and the whole API), or any module the ingress shares
    with the trainer and the ranks, loads none of HEAVY."""
    probe = f"import json, sys\nimport {imports}\nprint(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))"
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
    """Every status comes from app.api.error_responses, the one mapper."""
    routers = [p for p in _modules("app/api") if p.name != "error_responses.py"]
    assert len(routers) > 10
    offenders = {str(p.relative_to(ROOT)): found for p in routers if (found := inline_statuses(p.read_text()))}
    assert offenders == {}


def test_test_module_names_are_unique() -> None:
    """The test folders are not packages: pytest imports two modules with one basename as one, and stops."""
    names = [p.name for p in (ROOT / "tests").rglob("test_*.py")]
    assert len(names) > 30
    assert sorted({n for n in names if names.count(n) > 1}) == []
