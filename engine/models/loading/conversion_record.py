"""The record a converted model folder keeps of itself: ``tandem-converted.json`` beside the
weights, naming the GGUF file it came from, its quantization, each file's size and xxh3-128
digest, and the files' stamps at their last full check (so a quick check trusts unchanged files
and hashes any that were written since). Both the default pair's conversion and the precision
labels read it; neither needs the other for that.
"""
from __future__ import annotations

import json
import logging
import mmap
import os
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger(__name__)
MARKER = "tandem-converted.json"
CHUNK = 64 << 20  # what one digest update reads
Progress = Callable[[str, int, int], None]  # (stage, done, total)


def read_record(folder: Path) -> dict | None:
    """The folder's record; None where there is none or it is unreadable."""
    try:
        record = json.loads((Path(folder) / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def file_digest(path: Path, progress: Progress | None = None) -> str:
    """xxh3-128 of a file's bytes (about 7 GB/s here from the page cache)."""
    import xxhash

    digest = xxhash.xxh3_128()
    size = path.stat().st_size
    if size:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            view = memoryview(data)
            try:
                for start in range(0, size, CHUNK):
                    digest.update(view[start:start + CHUNK])
                    if progress:
                        progress("verify", min(size, start + CHUNK), size)
            finally:
                view.release()
    return digest.hexdigest()


def _stamp(path: Path) -> list[int]:
    """What changes whenever a file is written, renamed over or replaced (ctime cannot be set back)."""
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def _write_record(folder: Path, record: dict) -> None:
    tmp = folder / (MARKER + f".tmp{os.getpid()}")
    tmp.write_text(json.dumps(record, indent=1))
    os.replace(tmp, folder / MARKER)


def record_conversion(folder: Path, source: str, dtype: str, quantization: str | None = None) -> None:
    """Write the marker with every file's size and digest, and mark them checked.
    ``quantization``: how the source GGUF held the weights ("Q4_K_M"), for the precision labels
    (engine.models.planning.precision_labels: a later dequantized or re-quantized load says so)."""
    files, verified = {}, {}
    for f in sorted(p for p in folder.iterdir() if p.is_file() and not p.name.startswith(MARKER)):
        files[f.name] = {"size": f.stat().st_size, "xxh3_128": file_digest(f)}
        verified[f.name] = _stamp(f)
    record = {"source": source, "dtype": dtype, "files": files, "verified": verified}
    if quantization:
        record["quantization"] = quantization
    _write_record(folder, record)


def record_quantization(folder: Path, gguf_path: Path) -> None:
    """Add the source file's quantization to a conversion recorded without it (read from the
    GGUF header, once), so that labels never need to open the file."""
    from engine.gguf.metadata_cache import quantization_of

    record = read_record(folder)
    if record is None or record.get("quantization") or not gguf_path.is_file():
        return
    try:
        name = quantization_of(gguf_path)
    except Exception as exc:  # a label is not worth failing a load over; the file's own load says what is wrong
        log.warning("could not read the quantization of %s: %s", gguf_path, exc)
        return
    _write_record(folder, {**record, "quantization": name})


def verify_converted(folder: Path, progress: Progress | None = None, full_check: bool = False) -> str | None:
    """None when ``folder`` holds a complete, undamaged conversion; else what is wrong (with the
    file's path). Folders converted before digests were recorded are checked once by their
    safetensors headers and a scan for non-finite weights, then their digests are recorded."""
    try:
        record = json.loads((folder / MARKER).read_text())
        files = record.get("files")
    except (OSError, ValueError, AttributeError) as exc:
        return f"its record {folder / MARKER} is unreadable ({exc})"
    if files is None:
        problem = _check_unrecorded(folder)
        if problem is None:
            log.info("recording the digests of %s (converted by an earlier version)", folder)
            record_conversion(folder, record.get("source", ""), record.get("dtype", ""), record.get("quantization"))
        return problem
    verified = dict(record.get("verified") or {})
    changed = False
    for name, expected in files.items():
        path = folder / name
        if not path.exists():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != expected["size"]:
            return f"{path} is truncated or changed ({size:,} bytes; {expected['size']:,} when it was converted)"
        if not full_check and verified.get(name) == _stamp(path):
            continue
        if file_digest(path, progress) != expected["xxh3_128"]:
            return f"{path} is damaged: its contents no longer match the digest recorded when it was converted"
        verified[name], changed = _stamp(path), True
    if changed:
        _write_record(folder, {**record, "verified": verified})
    return None


def _check_unrecorded(folder: Path) -> str | None:
    """A conversion without digests: headers against sizes, and every float weight finite."""
    import torch
    from safetensors import safe_open

    from engine.models.loading.loader import DamagedModelFiles, check_model_folder

    try:
        check_model_folder(folder)
        for file in sorted(folder.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    t = f.get_tensor(name)
                    if t.is_floating_point() and not torch.isfinite(t).all():
                        return f"{file} is damaged: {name} holds NaN or infinite values"
    except (FileNotFoundError, DamagedModelFiles) as exc:
        return str(exc)
    except Exception as exc:  # unreadable past its header
        return f"{folder} is unreadable ({exc})"
    return None
