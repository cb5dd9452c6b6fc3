"""The torch functions of the losses in the registry (app.training_data.losses): app.training.losses.functions."""
