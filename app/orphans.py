"""Child processes that die with their parent: a process started for a replica (a vLLM engine core, a decoding
process) is left an orphan when the replica is killed without shutting it down (Ray SIGKILLs replicas it stops, and
a stopped `serve run` ends replicas outside its process group the same way). `die_with_parent()`, called first
thing in the child, makes it kill itself within a second of its parent's death."""

from __future__ import annotations

import os
import signal
import threading
import time

_POLL_S = 1.0


def die_with_parent() -> None:
    """Watch this process's parent from a daemon thread; once it is gone (the process is handed to another parent),
    SIGKILL this process."""
    parent = os.getppid()
    threading.Thread(target=_exit_when_orphaned, args=(parent,), daemon=True, name="orphan-guard").start()


def _exit_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(_POLL_S)
    os.kill(os.getpid(), signal.SIGKILL)
