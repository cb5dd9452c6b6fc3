"""Architecture rules: app/ never imports Ray Serve; the ingress loads no training or vLLM stack; what the ingress
shares with the trainer and the ranks (app/training_data, app/operations, app/messages) loads no torch; routers raise
errors instead of writing HTTP statuses; no import circles; no shared room imports a process's room, and a process's
room imports another's only where declared. (Modules are kept small by concept, not by a line count.)"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Collection
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


# -- the import graph: circles and rooms ------------------------------------------------------------------------------


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def imports_of(source: str, name: str, modules: Collection[str], package: bool = False) -> set[str]:
    """The modules among `modules` that the module `name` (a package's __init__ if `package`) imports anywhere in
    `source`: at the top, in a function, or for type checking only (two modules that name each other's types cannot
    be read apart either). `from a import b` is the module a.b if there is one, else a."""
    found: set[str] = set()
    here = name.split(".") if package else name.split(".")[:-1]  # what a relative import starts from
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            named = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here[: len(here) - node.level + 1]
                base = ".".join([*parts, base] if base else parts)
            named = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for target in named:
            while target and target not in modules:  # `import app.x.y` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph() -> dict[str, set[str]]:
    """Every module of app/ and deployments/ -> the modules of app/ and deployments/ it imports."""
    paths = {module_name(p): p for p in _modules("app", "deployments")}
    return {name: imports_of(p.read_text(), name, paths, p.name == "__init__.py") for name, p in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[frozenset[str]]:
    """The graph's circles: each set of modules that all reach each other (its strongly connected components of
    more than one module), by Tarjan's algorithm."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[frozenset[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = {stack.pop()}
            while node not in component:
                component.add(stack.pop())
            if len(component) > 1:
                found.append(frozenset(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_circle_finder_finds_every_circle_and_only_circles() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}, "f": {"a"}}
    assert sorted(map(sorted, circles(graph))) == [["a", "b", "c"], ["e", "e2"]]
    assert circles({"a": {"b"}, "b": {"c"}, "c": set()}) == []


def test_imports_are_read_in_every_spelling_and_place() -> None:
    modules = {"app.x", "app.x.y", "app.z", "app.w"}
    source = (
        "from typing import TYPE_CHECKING\nimport app.z\nfrom app.x import y\nimport os\n"
        "if TYPE_CHECKING:\n    from app.w import Thing\n"
        "def f():\n    from . import y\n"
    )
    assert imports_of(source, "app.x.v", modules) == {"app.z", "app.x.y", "app.w"}
    assert imports_of("from .x import y", "app", modules, package=True) == {"app.x.y"}
    assert imports_of("from app.x import Name", "app.q", modules) == {"app.x"}


def test_app_has_no_import_circles() -> None:
    """No module of app/ or deployments/ reaches itself through what it imports, type hints included: each room
    reads without the ones above it."""
    assert [sorted(circle) for circle in circles(import_graph())] == []


# Each process's own room: what only that process runs. Every other module of app/ is a shared room (what several
# processes import): it imports no process's room.
PROCESS_ROOMS = {
    "app.api": "ingress",
    "app.console": "ingress",
    "app.trainer": "trainer",
    "app.ranks": "ranks",
    "app.training": "ranks",
    "app.sampling": "sampler",
    "app.cli": "operator",
    "app.docs_reference": "docs build",
    "deployments": "serve",
}
# The arrows from one process's room into another's, and why.
ACROSS_PROCESSES = {
    ("serve", "ingress"): "the Serve deployments build every process",
    ("serve", "trainer"): "the Serve deployments build every process",
    ("serve", "ranks"): "the Serve deployments build every process",
    ("serve", "sampler"): "the Serve deployments build every process",
    ("trainer", "ranks"): "the trainer starts the ranks' command loop and sizes passes as the ranks lay out datums",
    ("ingress", "sampler"): "the ingress builds the Sampler's requests and reads its responses' shapes",
    ("docs build", "ingress"): "the docs' HTTP reference is the API's own OpenAPI",
}


def room_of(module: str) -> str | None:
    """The process whose room holds `module`, or None for a shared room."""
    for prefix, process in PROCESS_ROOMS.items():
        if module == prefix or module.startswith(prefix + "."):
            return process
    return None


def up_arrows(graph: dict[str, set[str]]) -> list[str]:
    """The imports from a shared room into a process's room, and from a process's room into another's that
    ACROSS_PROCESSES does not declare."""
    found = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            source, into = room_of(module), room_of(target)
            if into is None or source == into or (source, into) in ACROSS_PROCESSES:
                continue
            found.append(f"{module} ({source or 'shared'}) -> {target} ({into})")
    return found


def test_the_room_check_sees_an_arrow_up_and_one_across() -> None:
    graph = {
        "app.link.mailbox": {"app.trainer.service", "app.messages"},  # shared -> trainer
        "app.ranks.execute": {"app.trainer.shipping", "app.link.shipping"},  # ranks -> trainer
        "app.trainer.worker_group": {"app.ranks.command_loop"},  # declared
    }
    assert up_arrows(graph) == [
        "app.link.mailbox (shared) -> app.trainer.service (trainer)",
        "app.ranks.execute (ranks) -> app.trainer.shipping (trainer)",
    ]


def test_no_shared_room_imports_a_process_room_and_processes_only_the_declared_others() -> None:
    """What several processes share (app.link, app.messages, app.training_data, app.protocol, app.operations, app.db,
    ...) imports none of the trainer's, the ranks', the ingress's or the sampler's rooms, nor deployments/; the rank
    process imports nothing of the trainer or the ingress."""
    graph = import_graph()
    assert {room_of(m) for m in graph} >= set(PROCESS_ROOMS.values()) | {None}
    assert up_arrows(graph) == []
