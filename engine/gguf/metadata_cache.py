"""What a GGUF file's header yields, kept in the app's cache dir so the next load skips it.

What is made from the header costs something where the vocabulary is large: for the default
target (151,936 tokens, 151,387 merges) engine.gguf.hf_metadata makes the config in
milliseconds and the tokenizer in ~1 s from engine.gguf.header's parse (transformers' own GGUF
path, kept as the fallback, takes ~8 s for each: it re-reads the header with gguf-py). All of it
is a function of the header bytes alone, so one cache entry per file holds it: the tensor table
(names, types, shapes, byte ranges), the scalar metadata, the transformers config and the
tokenizer.

An entry is used only while every part's header is byte-for-byte the one it was made from (its
sha256 is checked on each load: ~6 MB read, milliseconds); otherwise it is rebuilt. The tensor
data is never cached: it stays in the GGUF file, memory-mapped.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from pathlib import Path

from engine.core.paths import cache_dir
from engine.gguf import hf_metadata
from engine.gguf.chat_template import guard
from engine.gguf.header_checks import check_header
from engine.gguf.reader import (
    GgufError,
    GgufFile,
    LongArray,
    from_table,
    open_gguf,
    split_parts,
    table_of,
)

log = logging.getLogger(__name__)

FORMAT = 1
_TABLE = "tensors.json"


def entry_dir(path: Path) -> Path:
    """This GGUF file's cache entry (one per file location)."""
    first = split_parts(Path(path))[0].resolve()
    key = hashlib.sha256(str(first).encode()).hexdigest()[:16]
    return cache_dir() / "gguf-metadata" / f"{first.stem}-{key}"


def header_sha256(path: Path, data_offset: int) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        digest.update(f.read(data_offset))
    return digest.hexdigest()


def open_cached(path: Path) -> tuple[GgufFile, Path]:
    """(the opened file, its cache entry): from the entry's tensor table where it is current,
    else parsed now (and the entry rebuilt with its table)."""
    path = Path(path)
    if not path.exists():
        raise GgufError(f"{path} does not exist")
    parts = split_parts(path)
    folder = entry_dir(path)
    table = _read_table(folder)
    if table is not None and _current(parts, table):
        metadata = {k: _from_json(v) for k, v in table["metadata"].items()}
        # An entry kept from before the header's numbers were checked is checked now.
        check_header(parts[0].name, metadata, {t["name"]: t["shape"] for t in table["tensors"]})
        offsets = tuple(int(p["data_offset"]) for p in table["parts"])
        return from_table(parts, metadata, table["tensors"], offsets), folder
    file = open_gguf(path)
    _write_entry(folder, file)
    return file, folder


def quantization_of(path: Path | str) -> str:
    """A .gguf file's quantization as its loader names it ("Q4_K_M"; engine.gguf.model), read
    from its header through this cache."""
    from engine.gguf.model import quantization

    file, _ = open_cached(Path(path))
    return quantization(file)


def config(file: GgufFile, folder: Path, read):
    """The transformers config: the entry's copy, else ``read(file)`` saved into the entry."""
    from transformers import AutoConfig

    saved = folder / "config"
    if (saved / "config.json").exists():
        try:
            return AutoConfig.from_pretrained(saved)
        except (OSError, ValueError) as exc:
            log.warning("cached config of %s unreadable (%s); reading the file again", file.name, exc)
    value = read(file)
    _save(lambda tmp: value.save_pretrained(tmp), saved, file)
    return value


def tokenizer(file: GgufFile, folder: Path):
    """The file's tokenizer: the entry's copy, else converted from the metadata and saved; its
    chat template renders with limits, refusals naming the file (engine.gguf.chat_template)."""
    from transformers import AutoTokenizer

    if "tokenizer.ggml.tokens" not in file.metadata:
        raise GgufError(f"{file.name} carries no tokenizer (no tokenizer.ggml.tokens metadata)")
    saved = folder / "tokenizer"
    if (saved / "tokenizer_config.json").exists():
        try:
            return guard(AutoTokenizer.from_pretrained(saved), file.name)
        except (OSError, ValueError) as exc:
            log.warning("cached tokenizer of %s unreadable (%s); converting it again", file.name, exc)
    value = hf_metadata.fast_or_transformers(
        lambda: hf_metadata.read_tokenizer(file.path, file.tensors),
        lambda: AutoTokenizer.from_pretrained(file.path.parent, gguf_file=file.path.name), file.name, "tokenizer")
    _save(lambda tmp: value.save_pretrained(tmp), saved, file)
    return guard(value, file.name)


# -- the entry ---------------------------------------------------------------------------------


def _read_table(folder: Path) -> dict | None:
    try:
        table = json.loads((folder / _TABLE).read_text())
    except (OSError, ValueError):
        return None
    return table if isinstance(table, dict) and table.get("format") == FORMAT else None


def _current(parts: tuple[Path, ...], table: dict) -> bool:
    recorded = table.get("parts", [])
    if [p.name for p in parts] != [r.get("name") for r in recorded]:
        return False
    for path, r in zip(parts, recorded):
        try:
            if path.stat().st_size != r["size"] or header_sha256(path, int(r["data_offset"])) != r["header_sha256"]:
                return False
        except (OSError, KeyError, ValueError):
            return False
    return True


def _write_entry(folder: Path, file: GgufFile) -> None:
    """A fresh entry holding only the tensor table (config and tokenizer are added as made)."""
    table = {
        "format": FORMAT,
        "parts": [{"name": p.name, "size": p.stat().st_size, "data_offset": off, "header_sha256": header_sha256(p, off)}
                  for p, off in zip(file.paths, file.data_offsets)],
        "metadata": {k: _to_json(v) for k, v in file.metadata.items()},
        "tensors": table_of(file),
    }
    try:
        if folder.exists():
            shutil.rmtree(folder)
        folder.mkdir(parents=True)
        tmp = folder / (_TABLE + ".tmp")
        tmp.write_text(json.dumps(table))
        os.replace(tmp, folder / _TABLE)
    except OSError as exc:  # a read-only or full cache dir: the model still loads, slower next time
        log.warning("could not cache the header of %s (%s)", file.name, exc)


def _save(write, dest: Path, file: GgufFile) -> None:
    tmp = dest.with_name(dest.name + ".tmp")
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        write(tmp)
        shutil.rmtree(dest, ignore_errors=True)
        os.replace(tmp, dest)
    except OSError as exc:
        log.warning("could not cache %s of %s (%s)", dest.name, file.name, exc)


def _to_json(value):
    if isinstance(value, LongArray):
        return {"long_array": value.length}
    return value


def _from_json(value):
    if isinstance(value, dict) and set(value) == {"long_array"}:
        return LongArray(int(value["long_array"]))
    return value
