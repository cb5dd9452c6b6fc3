"""app.orphans: a process that calls die_with_parent() is gone within seconds of its parent's death, where it would
otherwise live on (the decoding processes and vLLM engine cores of a killed replica)."""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

CHILD = "import time; from app.orphans import die_with_parent; {guard}time.sleep(60)"
PARENT = (
    "import subprocess, sys, time; child = subprocess.Popen([sys.executable, '-c', {child!r}], "
    "stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL); print(child.pid, flush=True); time.sleep(1)"
)


def _orphan(guard: bool) -> psutil.Process:
    """A child left behind by a parent that exits after a second; the child calls die_with_parent() when `guard`."""
    child = CHILD.format(guard="die_with_parent(); " if guard else "")
    parent = subprocess.run([sys.executable, "-c", PARENT.format(child=child)], capture_output=True, text=True)
    return psutil.Process(int(parent.stdout.split()[0]))


@pytest.mark.parametrize("guard", [True, False])
def test_a_guarded_child_dies_with_its_parent(guard: bool) -> None:
    orphan = _orphan(guard)
    try:
        deadline = time.monotonic() + 5
        while orphan.is_running() and orphan.status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
            time.sleep(0.2)
        gone = not orphan.is_running() or orphan.status() == psutil.STATUS_ZOMBIE
        assert gone is guard  # unguarded, it lives on: what the guard is for
    finally:
        if orphan.is_running():
            orphan.kill()
