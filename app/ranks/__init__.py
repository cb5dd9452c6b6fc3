"""The worker group: a Ray Train TorchTrainer whose train loop serves commands from a mailbox actor.

Everything outside this package talks to it through `WorkerGroup` (start / send / call / check_health / stop).
"""
