"""Pure-torch training: batches, losses, LoRA models, optimizer; the same code runs in a worker or a unit test."""
