"""vLLM's engine core process dies with the process that started it.

AsyncLLM runs its engine core in a child process (`VLLM::EngineCore`, spawned: the Sampler replica is a Ray actor),
and nothing in vLLM 0.32 ends that child when its parent dies without shutting it down. Ray reaps it when it kills a
replica itself, but a replica that Serve started to replace a killed one sits outside `serve run`'s process group:
stopping the server (SIGTERM to the group, SIGKILL later) ended the replica with its raylet and left its engine core
an orphan holding its KV cache and weights (0.9 GB for the 0.6B shape; reproduced: tests/integration/
test_bare_serve_run.py). `guard_engine_cores()`, called in the parent before the engine
starts, makes each engine core it spawns watch its parent (app.orphans): once the parent is gone, the child kills
itself within a second.
"""

from __future__ import annotations

from typing import Any

from app.orphans import die_with_parent

_original: Any = None  # vLLM's entry point, once replaced here (a forked child inherits it; a spawned one has none)


def guard_engine_cores() -> None:
    """Engine cores started from this process from now on watch it (idempotent)."""
    global _original
    from vllm.v1.engine.core import EngineCoreProc

    if EngineCoreProc.run_engine_core is not run_engine_core:
        _original = EngineCoreProc.__dict__["run_engine_core"]
        EngineCoreProc.run_engine_core = staticmethod(run_engine_core)


def run_engine_core(*args: Any, **kwargs: Any) -> None:
    """The spawned child's entry point (importable by name, as spawn needs): watch the parent, then run vLLM's."""
    from vllm.v1.engine.core import EngineCoreProc

    die_with_parent()
    original = _original or EngineCoreProc.__dict__["run_engine_core"]  # spawned: vLLM imported afresh, unpatched
    original.__func__(*args, **kwargs)
