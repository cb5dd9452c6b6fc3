"""What runs in each rank's process (a Ray Train worker): the command loop that takes messages from the trainer's
mailbox actor, the executor that runs each command against the rank's TrainingEngine (app.training), and rank 0's
snapshot writer. The trainer's side of the group is app.trainer.worker_group.
"""
