"""Torch training, run by the ranks: the base model, LoRA adapters, the losses' torch functions, custom loss
interpretation, optimizers, checkpoints; the same code runs in a rank or a unit test. What requests carry (batches,
validation, the loss registry) is app.training_data, which loads no torch."""
