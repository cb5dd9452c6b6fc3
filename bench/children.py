"""Runs a benchmark script once per setting, each in a child process with a server of its own, and collects the
JSON each child prints on its `RESULT ` line."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterable


def results_per_setting(script: str, flag: str, settings: Iterable[int]) -> dict[int, dict]:
    """`script` run again with this command line plus `flag <setting>`, for each setting in turn."""
    results = {}
    for setting in settings:
        cmd = [sys.executable, script, *sys.argv[1:], flag, str(setting)]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        results[setting] = json.loads(next(line for line in out.splitlines() if line.startswith("RESULT "))[7:])
    return results
