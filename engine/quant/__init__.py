"""Quantized weights: int8 / int4 linear layers and the on-disk cache of converted weights."""
