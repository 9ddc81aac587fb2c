"""Benchmarks and measurements: the prompt-set bench, step costs, drafter agreement, memory probe, GPU per-pass costs."""
