"""Architecture rules: app/ never imports Ray Serve, and no module grows past 400 lines."""

from __future__ import annotations

import ast
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


@pytest.mark.parametrize("source", ["import ray.serve", "import ray.serve.handle as h", "from ray import serve",
                                    "from ray.serve import deployment", "def f():\n    from ray.serve.handle import X"])
def test_detector_catches_every_spelling(source: str) -> None:
    assert serve_imports(source)


def test_detector_allows_ray_core_and_train() -> None:
    assert serve_imports("import ray\nimport ray.train\nfrom ray.train.torch import TorchTrainer\n"
                         "from ray import train\nimport serve") == []


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
