"""What this machine (or a described one) has to run models with: RAM, CPU, GPUs, disk.

``detect_hardware()`` looks at the real machine's memory, CPU and disk (its GPUs come from
engine.models.loading.machine, which asks torch); ``Hardware.from_profile()`` builds one from a
description (JSON with ram_gb, gpus [{name, vram_gb}], unified_memory_gb, disk_free_gb), so users
can plan for hardware they don't have and tests can cover it. No torch here: the Qt app reads
profiles and fits on the GUI thread.

All sizes are bytes. A described "gb" is 10**9 bytes, as vendors (and users) mean it.
"""
from __future__ import annotations

import logging
import os
import platform
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil

log = logging.getLogger(__name__)
GB = 10**9


#: A profile names a few sizes and GPUs: hundreds of bytes. Far more is not a profile.
PROFILE_MAX_BYTES = 1 * 2**20
PROFILE_MAX_DEPTH = 16


class HardwareProfileError(ValueError):
    """A described machine that cannot be understood; the message says which field and why."""


@dataclass(frozen=True)
class Gpu:
    name: str
    total_bytes: int
    free_bytes: int


@dataclass(frozen=True)
class Hardware:
    """ram_available: what a new process can use without swapping. unified_memory: Apple
    silicon's shared CPU/GPU memory (None elsewhere); gpu_working_set: how much of it Metal lets
    one process keep resident (recommendedMaxWorkingSetSize), the real limit for MPS."""

    ram_total: int
    ram_available: int
    cpu_model: str
    cpu_cores: int | None  # physical cores; None when a profile doesn't say
    gpus: tuple[Gpu, ...] = ()
    unified_memory: int | None = None
    gpu_working_set: int | None = None
    disk_free: int | None = None
    source: str = "detected"  # "detected" or "profile"

    @property
    def is_apple(self) -> bool:
        return self.unified_memory is not None

    @property
    def best_gpu(self) -> Gpu | None:
        """The GPU with the most free memory (models are not split across GPUs)."""
        return max(self.gpus, key=lambda g: g.free_bytes, default=None)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_profile(cls, data: Any) -> "Hardware":
        return _from_profile(data)

    @classmethod
    def from_profile_file(cls, path: str | Path) -> "Hardware":
        """A described machine from a JSON file: read only when it is a regular file of at most
        ``PROFILE_MAX_BYTES`` (a FIFO, /dev/zero or a huge file is refused before it is read)."""
        from engine.core import bounded_json

        path = Path(path)
        try:
            data = bounded_json.read_bytes(path, PROFILE_MAX_BYTES)
        except OSError as exc:
            raise HardwareProfileError(f"cannot read hardware profile {path}: {exc.strerror or exc}") from exc
        except bounded_json.JSONFileError as exc:
            raise HardwareProfileError(f"cannot read hardware profile: {exc}") from exc
        try:
            data = bounded_json.loads(data, PROFILE_MAX_DEPTH, where=f"hardware profile {path}")
        except bounded_json.JSONFileError as exc:
            raise HardwareProfileError(str(exc)) from exc
        return _from_profile(data)


# -- described machines ------------------------------------------------------------------------

_PROFILE_FIELDS = {"name", "ram_gb", "ram_available_gb", "cpu", "cpu_cores", "gpus", "unified_memory_gb",
                   "gpu_working_set_gb", "disk_free_gb"}


def _number(data: dict, key: str, required: bool = False, where: str = "profile") -> float | None:
    if key not in data or data[key] is None:
        if required:
            raise HardwareProfileError(f"hardware {where} is missing {key!r} (a number of gigabytes)")
        return None
    value = data[key]
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise HardwareProfileError(f"hardware {where}: {key!r} must be a number of gigabytes, not {value!r}")
    if value < 0 or value != value or value == float("inf"):
        raise HardwareProfileError(f"hardware {where}: {key!r} must be a finite number >= 0, not {value!r}")
    return float(value)


def os_reserve(total: int) -> int:
    """Memory a described machine's OS and desktop keep for themselves: at least 2 GB, or 20%.
    (A detected machine reports what is actually available instead.)"""
    return max(2 * GB, total // 5)


def apple_working_set(unified: int) -> int:
    """Metal's recommendedMaxWorkingSetSize, as macOS sets it: about 2/3 of unified memory up to
    36 GB and about 3/4 above (what torch.mps.recommended_max_memory reports on a real Mac)."""
    return unified * 2 // 3 if unified <= 36 * GB else unified * 3 // 4


def _from_profile(data: Any) -> Hardware:
    if not isinstance(data, dict):
        raise HardwareProfileError(
            f"a hardware profile must be a JSON object like "
            f'{{"ram_gb": 16, "gpus": [{{"name": "RTX 4060", "vram_gb": 8}}]}}, not {type(data).__name__}'
        )
    unknown = sorted(set(data) - _PROFILE_FIELDS)
    if unknown:
        raise HardwareProfileError(
            f"hardware profile has unknown field(s) {', '.join(map(repr, unknown))}; "
            f"known: {', '.join(sorted(_PROFILE_FIELDS))}"
        )
    unified_gb = _number(data, "unified_memory_gb")
    ram_gb = _number(data, "ram_gb", required=unified_gb is None)
    if ram_gb is None:
        ram_gb = unified_gb  # on Apple silicon RAM and unified memory are the same memory
    elif unified_gb is not None and abs(ram_gb - unified_gb) > 0.5:
        raise HardwareProfileError(
            f"hardware profile: ram_gb ({ram_gb:g}) and unified_memory_gb ({unified_gb:g}) disagree; on "
            "Apple silicon they are the same memory (give one of them)"
        )
    if ram_gb <= 0:
        raise HardwareProfileError("hardware profile: ram_gb must be more than 0")
    ram_total = int(ram_gb * GB)
    available_gb = _number(data, "ram_available_gb")
    ram_available = int(available_gb * GB) if available_gb is not None else ram_total - os_reserve(ram_total)
    if ram_available > ram_total:
        raise HardwareProfileError("hardware profile: ram_available_gb is larger than ram_gb")

    gpus_data = data.get("gpus") or []
    if not isinstance(gpus_data, list):
        raise HardwareProfileError(f"hardware profile: 'gpus' must be a list of {{name, vram_gb}}, not {gpus_data!r}")
    gpus = []
    for i, gpu in enumerate(gpus_data):
        where = f"profile gpus[{i}]"
        if not isinstance(gpu, dict):
            raise HardwareProfileError(f"hardware {where} must be an object {{name, vram_gb}}, not {gpu!r}")
        vram = _number(gpu, "vram_gb", required=True, where=where)
        if vram <= 0:
            raise HardwareProfileError(f"hardware {where}: vram_gb must be more than 0")
        free = _number(gpu, "vram_free_gb", where=where)
        name = gpu.get("name", f"GPU {i}")
        if not isinstance(name, str):
            raise HardwareProfileError(f"hardware {where}: name must be a string, not {name!r}")
        total = int(vram * GB)
        gpus.append(Gpu(name=name, total_bytes=total, free_bytes=int(free * GB) if free is not None else total))
    if unified_gb is not None and gpus:
        raise HardwareProfileError("hardware profile: Apple unified memory and discrete GPUs cannot be combined")

    unified = int(unified_gb * GB) if unified_gb is not None else None
    working_gb = _number(data, "gpu_working_set_gb")
    working_set = None
    if unified is not None:
        working_set = int(working_gb * GB) if working_gb is not None else apple_working_set(unified)
    disk_gb = _number(data, "disk_free_gb")
    cores = data.get("cpu_cores")
    if cores is not None and (isinstance(cores, bool) or not isinstance(cores, int) or cores < 1):
        raise HardwareProfileError(f"hardware profile: cpu_cores must be a whole number, not {cores!r}")
    return Hardware(
        ram_total=ram_total,
        ram_available=ram_available,
        cpu_model=str(data.get("cpu") or data.get("name") or "described machine"),
        cpu_cores=cores,
        gpus=tuple(gpus),
        unified_memory=unified,
        gpu_working_set=working_set,
        disk_free=int(disk_gb * GB) if disk_gb is not None else None,
        source="profile",
    )


# -- this machine ------------------------------------------------------------------------------


def cpu_model() -> str:
    """The CPU's marketing name where the OS tells it, else the architecture."""
    try:
        if platform.system() == "Linux":
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
        elif platform.system() == "Darwin":
            import subprocess

            out = subprocess.run(["sysctl", "-n", "machdep.cpu.brand_string"], capture_output=True, text=True, timeout=5)
            if out.returncode == 0 and out.stdout.strip():
                return out.stdout.strip()
    except (OSError, ValueError) as exc:
        log.debug("no CPU model name: %s", exc)
    return platform.processor() or platform.machine() or "unknown CPU"


def disk_free(path: Path) -> int | None:
    """Free bytes on the disk that holds ``path`` (or its nearest existing parent)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        return shutil.disk_usage(path).free
    except OSError:
        return None


def detect_hardware(cache: Path | None = None, gpus: tuple[Gpu, ...] = (), working_set: int | None = None) -> Hardware:
    """This machine's RAM, CPU and disk, with the GPUs a probe found (none by default: finding
    them imports torch, engine.models.loading.machine does). ``cache``: where models are stored
    (free disk is measured there; default: the Hugging Face cache). ``working_set``: what an
    Apple GPU may use of the unified memory, where there is one."""
    memory = psutil.virtual_memory()
    unified = memory.total if working_set is not None else None
    if cache is None:
        from huggingface_hub import constants

        cache = Path(constants.HF_HUB_CACHE)
    return Hardware(
        ram_total=int(memory.total),
        ram_available=int(memory.available),
        cpu_model=cpu_model(),
        cpu_cores=psutil.cpu_count(logical=False) or os.cpu_count() or 1,
        gpus=gpus,
        unified_memory=unified,
        gpu_working_set=working_set,
        disk_free=disk_free(cache),
        source="detected",
    )
