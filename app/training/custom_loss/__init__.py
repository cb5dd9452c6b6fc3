"""Server-side custom losses: the allow-list (ops), the validated program (program; no torch, the ingress uses it)
and the torch interpreter the workers run (interpreter, imported only there)."""

from app.training.custom_loss.program import CustomLossProgram, LossNode, validate_custom_loss

__all__ = ["CustomLossProgram", "LossNode", "validate_custom_loss"]
