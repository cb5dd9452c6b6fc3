"""This machine's processes as /proc shows them, for the tests that kill and stop servers and look for what is
left. Each reader answers for a process that is gone (or not ours to read) as for one with nothing to show."""

from __future__ import annotations

from pathlib import Path


def pids() -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]


def cmdline(pid: int) -> bytes:
    return _read(pid, "cmdline")


def environ(pid: int) -> list[bytes]:
    """Its environment's NAME=VALUE entries."""
    return _read(pid, "environ").split(b"\0")


def parent(pid: int) -> int | None:
    fields = _stat(pid)
    return int(fields[1]) if fields else None


def alive(pid: int) -> bool:
    """Whether it exists and is not a zombie."""
    fields = _stat(pid)
    return bool(fields) and fields[0] != "Z"


def _stat(pid: int) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name: state, parent, ..."""
    return _read(pid, "stat").decode().rsplit(")", 1)[-1].split()


def _read(pid: int, name: str) -> bytes:
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""
