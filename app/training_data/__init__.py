"""What a training request carries and how it is checked, in numpy (no torch): packed batches, their
validation against the loss registry and the limits, provenance, custom loss programs, and the shards the ranks
split a batch into. The ingress, the Trainer and the ranks all import it."""
