"""The malloc of the training ranks an in-process benchmark spawns: tcmalloc where installed, as the server's CPU
ranks run (app.allocator), or glibc's (the figures before it)."""

from __future__ import annotations

import argparse
import os


def add_allocator_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allocator",
        choices=["tcmalloc", "glibc"],
        default="tcmalloc",
        help="the ranks' malloc: tcmalloc where installed, as the server's CPU ranks (app.allocator), or glibc's",
    )


def use_allocator(choice: str) -> None:
    """Before spawning the ranks: they start with `choice` (spawned processes take this process's environment)."""
    if choice == "tcmalloc":
        from app.allocator import preload_tcmalloc

        os.environ.update(preload_tcmalloc())
