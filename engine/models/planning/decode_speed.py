"""Plain decoding speed on the CPU, predicted per precision from the bytes read per token.

A CPU decode step reads every resident target weight once, so tokens/sec = the bandwidth the
kernels reach at that precision / the weight bytes at that precision. The bandwidth is not one
number: the 16-bit kernels are compute-bound on AVX2 and the int4 kernels stream near the memory
limit, so each (CPU class, precision) has its own effective bytes/s per core, calibrated from
plain-decoding runs of the default 1.5B target on 2 cores (docs/benchmarks/, greedy, 96 tokens):

* AVX-512 VNNI machine ("B"): bf16 8.3 tok/s (int4-code-final: int4 32.89 tok/s = 3.96x bf16),
  int8 18.82 tok/s (int8-code-final), int4 32.89 tok/s (int4-code-final).
* AVX2-only machine ("A"): bf16 ~4.2 tok/s (fast-code-hf 4.12, fast-math-prose-qa-hf 4.24),
  int8 ~8.5 tok/s (int8-code-int16-inputs runs 8.83 / 8.09), int4 ~25 tok/s (design notes:
  the same-run comparison with llama.cpp).

Bytes per token are memory_fit's resident weights at the precision (3.09 GB bf16, 1.55 GB
int8, 0.96 GB int4 for that target). fp32 has no per-token run recorded: it reads twice bf16's
bytes at ~1.6x bf16's time (transformers' generate, design notes), i.e. 1.25x bf16's bandwidth.

No torch here: the picker calls it on the GUI thread.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from engine.models.planning.catalog import canonical_precision
from engine.models.planning.hardware import Hardware

# Effective bytes/s per core that plain decoding reached, per CPU class and precision.
_BANDWIDTH_PER_CORE = {
    "avx512_vnni": {"bf16": 12.8e9, "fp16": 12.8e9, "fp32": 16.0e9, "int8": 14.6e9, "int4": 15.9e9},
    "avx2": {"bf16": 6.5e9, "fp16": 6.5e9, "fp32": 8.1e9, "int8": 6.6e9, "int4": 12.0e9},
}
_SOURCE = {
    "avx512_vnni": "calibrated on a 2-core AVX-512 VNNI EPYC (docs/benchmarks, default 1.5B target)",
    "avx2": "calibrated on a 2-core AVX2 EPYC (docs/benchmarks, default 1.5B target)",
}
# A GGUF file (precision "file") computes with kernels.gguf_linear: llama.cpp's recipe, integer
# products per block like the int4 kernel's, and it reaches int4's bandwidth: on the VNNI machine
# the default Q4_K_M target (0.98 GB resident) decodes 29.4-33.6 tok/s plain at 2 threads
# on a quiet machine, 14.5-16.5e9 B/s per core against int4's 15.9e9. On the AVX2-only machine
# the same target decoded 19.8 tok/s plain at 2 threads beside llama.cpp (its Q4_K / Q6_K in the
# AVX2 tiles' own layout, docs/benchmarks/2026-12-06-peer-llamacpp-avx2-interleaved.json):
# 9.7e9 B/s per core, under int4's 12.0e9.
for _row in _BANDWIDTH_PER_CORE.values():
    _row["file"] = _row["int4"]
_BANDWIDTH_PER_CORE["avx2"]["file"] = 9.7e9
# One socket's memory caps what many cores reach together.
BANDWIDTH_CAP = 60e9


@dataclass(frozen=True)
class SpeedHint:
    tok_s: float
    precision: str
    source: str  # where the figure comes from, for a tooltip

    def text(self) -> str:
        return f"≈{self.tok_s:.0f} tok/s" if self.tok_s >= 1.5 else f"≈{self.tok_s:.1f} tok/s (slow)"


@lru_cache(maxsize=1)
def cpu_class(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """"avx512_vnni" when this CPU has the VNNI tiles the quantized kernels use, else "avx2"."""
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return "avx2"
    return "avx512_vnni" if "avx512_vnni" in text else "avx2"


def predict_plain_rate(hardware: Hardware, weight_bytes: int, precision: str, klass: str | None = None) -> SpeedHint | None:
    """Expected plain tokens/sec at ``precision`` reading ``weight_bytes`` a token on
    ``hardware``'s CPU cores; None when the core count is unknown."""
    if not hardware.cpu_cores or weight_bytes <= 0:
        return None
    name = canonical_precision(precision)
    klass = klass or cpu_class()
    bandwidth = min(_BANDWIDTH_PER_CORE[klass][name] * hardware.cpu_cores, BANDWIDTH_CAP)
    source = (f"predicted: {weight_bytes / 1e9:.2f} GB of {name} weights read per token at "
              f"{bandwidth / 1e9:.0f} GB/s on {hardware.cpu_cores} cores, {_SOURCE[klass]}")
    return SpeedHint(bandwidth / weight_bytes, name, source)
