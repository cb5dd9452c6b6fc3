"""Each rank's entry point as Ray Train runs it. The trainer replica hands Ray Train a reference to `run`, which
imports nothing heavy: the rank's own modules (torch's models, transformers, peft: about 3.6 s of CPU) load in the
rank, not in every Trainer replica that starts a group."""

from __future__ import annotations


def run(config: dict) -> None:
    """The rank's command loop (app.ranks.command_loop), with `config` as Ray Train's train_loop_config."""
    from app.ranks.command_loop import command_loop

    command_loop(config)
