"""Sampling: request checks, the vLLM engine adapter and result encoding."""
