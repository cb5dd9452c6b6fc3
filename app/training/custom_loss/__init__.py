"""Running custom losses on the ranks: the interpreter (binding each allowed name of
app.training_data.custom_loss_ops to its torch callable) and its budget. The validated program is
app.training_data.custom_losses."""
