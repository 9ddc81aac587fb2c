"""Tandem's engine: everything that computes. Never imports Qt."""
