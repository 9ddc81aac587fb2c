"""What this CPU offers the compiled kernels, for tests that run both tile sets."""
import importlib
import os
from contextlib import contextmanager
from pathlib import Path


def _cpu_flags() -> set[str]:
    cpuinfo = Path("/proc/cpuinfo")
    lines = cpuinfo.read_text().splitlines() if cpuinfo.exists() else []
    return set(next((line for line in lines if line.startswith("flags")), "").split())


HAS_VNNI = {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"} <= _cpu_flags()
# TANDEM_AVX512=0 turns the VNNI tiles off by default (fixtures can still switch them on).
VNNI_BY_DEFAULT = HAS_VNNI and os.environ.get("TANDEM_AVX512") != "0"


def kernel_params(available: list[str]) -> list[str]:
    """Every backend; the compiled one twice where the CPU has AVX-512 VNNI ("cpu_avx2" runs its
    AVX2 tiles, "cpu_avx2/avx512_vnni" its VNNI tiles)."""
    return available + (["cpu_avx2/avx512_vnni"] if "cpu_avx2" in available and HAS_VNNI else [])


@contextmanager
def kernel_in_use(package, param: str, isa: str, allow: str, allow_amx: str | None = None):
    """Run ``package`` on the backend and tile set ``param`` names (see kernel_params), then put
    back what was in use. ``isa`` / ``allow``: the names of the compiled module's tile-set query
    and switch (``a16_isa`` / ``a16_allow_vnni``, ``int4_isa`` / ``int4_allow_vnni``);
    ``allow_amx``: its AMX switch, for a package whose tile sets include "amx_int8" (the VNNI
    tiles plus AMX ones)."""
    name, _, tiles = param.partition("/")
    previous = package.active_backend()
    package.use_backend(name)
    compiled = importlib.import_module(f"{package.__name__}.cpu_avx2") if name == "cpu_avx2" else None
    if compiled is not None:
        was = getattr(compiled, isa)()
        was_on = was in ("avx512_vnni", "amx_int8") or not HAS_VNNI
        getattr(compiled, allow)(tiles in ("avx512_vnni", "amx_int8"))
        if allow_amx is not None:
            getattr(compiled, allow_amx)(tiles == "amx_int8")
        assert getattr(compiled, isa)() == (tiles or "avx2")
    try:
        yield param
    finally:
        if compiled is not None:
            getattr(compiled, allow)(was_on)
            if allow_amx is not None:
                getattr(compiled, allow_amx)(was != "avx512_vnni")  # VNNI without AMX: they were off
        package.use_backend(previous)
