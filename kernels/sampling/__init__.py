"""Turning logits into the distribution a decoder samples from."""
from kernels.sampling.reference import greedy_token, process_logits, sample_from

__all__ = ["greedy_token", "process_logits", "sample_from"]
