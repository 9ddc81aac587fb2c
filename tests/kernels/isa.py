"""What this CPU offers the compiled kernels, for tests that run both tile sets."""
import os
from pathlib import Path


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return set(next((line for line in lines if line.startswith("flags")), "").split())


HAS_VNNI = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= _cpu_flags()
# TANDEM_AVX512=0 turns the VNNI tiles off by default (fixtures can still switch them on).
VNNI_BY_DEFAULT = HAS_VNNI and os.environ.get("TANDEM_AVX512") != "0"
