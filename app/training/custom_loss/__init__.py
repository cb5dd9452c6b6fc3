"""Running custom losses on the ranks: the interpreter, its allowed ops and its budget. The validated program is
app.training_data.custom_losses."""
