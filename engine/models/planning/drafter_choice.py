"""Which weights a separate draft model is held in, as a rule of the target's precision and the
kernels that run: one rule for the loader (engine.models.loading.loader.drafter_weights, which asks
the kernels themselves) and the memory fit (engine.models.planning.memory_fit, which must not import
torch, so it is told or guesses which kernels run).

No torch here: the app runs the fit on the GUI thread.
"""
from __future__ import annotations

import functools
import platform
from pathlib import Path

# Targets whose one-token step is as cheap as an int4 one: next to them the drafter's step is a
# large share of each pass, and the int4 drafter (~60% of int8's bytes) pays for its lower
# acceptance (measurements in engine.models.loading.loader.drafter_weights).
CHEAP_STEP_TARGETS = ("int8", "int4", "file")


def auto_drafter_weights(precision: str, on_cpu: bool, *, int8_kernel: bool, int4_kernel: bool,
                         int4pack: bool = True) -> str | None:
    """What "auto" holds a draft model's weights in next to a target at ``precision`` ("bf16",
    "fp32", "int8", "int4", "file"):
    on the CPU where the int8 kernel runs, int8, or int4 next to a cheap-step target where the
    int4 kernel runs too; elsewhere int4 next to an int4 target where torch's 4-bit kernels run
    (``int4pack``: on a GPU or a Mac the pair's memory is what limits). None: the target's own
    dtype (the caller names it: the loader from the device, the fit from its bytes per element)."""
    if on_cpu and int8_kernel:
        return "int4" if precision in CHEAP_STEP_TARGETS and int4_kernel else "int8"
    if precision == "int4" and int4pack:
        return "int4"
    return None


@functools.lru_cache(maxsize=1)
def cpu_kernels_expected(cpuinfo: Path = Path("/proc/cpuinfo")) -> bool:
    """Whether the engine's quantized CPU kernels (kernels/quant_linear, kernels/int4_linear:
    AVX2 with FMA) should run on this machine, told without torch: on Linux the CPU's flags
    say; any other x86-64 machine is taken to have them (every x86-64 Mac and PC sold in the
    last decade does); an ARM CPU (Apple silicon) has none. ``kernels.build`` asks torch, and
    the loader asks the kernels, which also need their build to have succeeded."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return False
    try:
        text = cpuinfo.read_text(errors="replace")
    except OSError:
        return True
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "").split()
    return not flags or ("avx2" in flags and "fma" in flags)
