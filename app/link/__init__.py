"""The trainer <-> rank link, what both processes import: the mailbox actor (its own process) that hands each
message to every rank and gathers their replies, the message and answer types the ranks' command loop reads, and
how a command travels (shipping: inside the message, or a large batch once through Ray's object store). The
trainer's side of the group is app.trainer.worker_group; the ranks' side is app.ranks. Nothing here imports
either."""
