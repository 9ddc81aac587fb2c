"""Header summaries, cached by (path, size, mtime) so that listing many models stays fast.

The first look at a GGUF file reads its header (engine.library.header, ~0.15 s for a
150k-token vocabulary); the summary is then kept in Tandem's cache dir under the file's
path with every part's size and mtime, and used while all of them still match. A file that
changed is read again; one that cannot be read is remembered as such (its message), so a
corrupt download is not re-parsed on every listing either. The cache is only ever a copy:
deleting it costs one header read per file.

engine.gguf.metadata_cache keeps what *loading* needs (tensor table, config, tokenizer) and
checks header bytes by digest; this keeps only what a list shows, checked by ``stat``.
"""
from __future__ import annotations

import json
import logging
from collections import Counter
from pathlib import Path

from engine.core.paths import cache_dir
from engine.gguf.reader import GgufError
from engine.library import vocab
from engine.library.header import GgufHeader, one_line, read_header
from engine.library.local_model import Summary
from engine.library.store import read_json, write_json_atomic

log = logging.getLogger(__name__)

#: 2: summaries also check every tensor's dimensions (a 0-length one is a problem); entries
#: written before are read again.
FORMAT = 2


def stamps(paths) -> list[list]:
    """[path, size, mtime_ns] per file: what must still match for a summary to hold."""
    out = []
    for p in paths:
        st = Path(p).stat()
        out.append([str(p), st.st_size, st.st_mtime_ns])
    return out


def check_dimensions(header: GgufHeader) -> None:
    """GgufError for a tensor with a dimension of 0: no model has one, and
    building a model, its memory estimate or a view of its data from it fails further on."""
    for tensor in header.tensors.values():
        if any(d < 1 for d in tensor.shape):
            shape = " x ".join(str(d) for d in tensor.shape)
            raise GgufError(f"{header.name} is corrupted (tensor {tensor.name} has shape {shape}; "
                            "every dimension must be at least 1)")


def summarize_header(header: GgufHeader) -> Summary:
    """The summary of a header read; ``problem`` set where Tandem cannot run the model (the
    loader's own checks and messages: architecture, tensor types, a missing tokenizer)."""
    from engine.gguf.model import check_architecture, check_tensor_types, quantization

    arch = header.metadata.get("general.architecture")
    problem = None
    try:
        check_dimensions(header)
        check_architecture(header)
        check_tensor_types(header)
        if header.tokens is None:
            raise GgufError(f"{header.name} carries no tokenizer (no tokenizer.ggml.tokens metadata)")
    except GgufError as exc:
        problem = str(exc)
    types = Counter(t.type_name for t in header.tensors.values())
    context = header.metadata.get(f"{arch}.context_length")
    return Summary(
        architecture=str(arch) if arch is not None else None,
        title=str(header.metadata["general.name"]) if "general.name" in header.metadata else None,
        quant=quantization(header) if header.tensors else None,
        quant_types=tuple(types.most_common()),
        parameter_count=header.parameter_count,
        context_length=int(context) if isinstance(context, int) else None,
        vocab_size=len(header.tokens) if header.tokens is not None else None,
        vocab_fingerprint=vocab.remember(header.tokens) if header.tokens is not None else None,
        problem=problem,
    )


def summarize_folder(folder: Path) -> Summary:
    """A model folder Tandem converted (config.json, tokenizer.json, *.safetensors)."""
    from safetensors import safe_open

    config = read_json(folder / "config.json") or {}
    count = 0
    for weights in sorted(folder.glob("*.safetensors")):
        with safe_open(str(weights), framework="numpy") as f:
            for key in f.keys():  # noqa: SIM118 (a safetensors file, not a dict)
                n = 1
                for d in f.get_slice(key).get_shape():
                    n *= d
                count += n
    tokens = vocab.tokens_of_folder(folder)
    return Summary(
        architecture=config.get("model_type"), title=config.get("_model_name_or_path") or folder.name,
        quant=config.get("dtype") or config.get("torch_dtype"), quant_types=(), parameter_count=count or None,
        context_length=config.get("max_position_embeddings"), vocab_size=len(tokens) if tokens else None,
        vocab_fingerprint=vocab.remember(tokens) if tokens else None,
        problem=None if tokens else f"{folder.name} has no tokenizer.json",
    )


def folder_files(folder: Path) -> list[Path]:
    return [folder / "config.json", folder / "tokenizer.json", *sorted(folder.glob("*.safetensors"))]


def _summarize_gguf(path: Path, display_name: str | None) -> Summary:
    """``summarize_header(read_header(path))``, where anything hostile bytes make go wrong is a
    ``GgufError`` naming the file (remembered like any other, so it is not re-read each time)."""
    try:
        return summarize_header(read_header(path, display_name))
    except GgufError:
        raise
    except (ArithmeticError, AttributeError, IndexError, KeyError, LookupError, TypeError, ValueError,
            RecursionError) as exc:
        log.debug("summarizing %s failed", path, exc_info=True)
        raise GgufError(f"{display_name or path.name} cannot be read ({one_line(exc)})") from None


class SummaryCache:
    """The cached summaries (one JSON file); ``save()`` writes it back if anything changed."""

    def __init__(self) -> None:
        self.path = cache_dir() / "library" / "headers.json"
        data = read_json(self.path)
        ok = isinstance(data, dict) and data.get("format") == FORMAT and isinstance(data.get("entries"), dict)
        self.entries: dict[str, dict] = data["entries"] if ok else {}
        self.changed = False

    def gguf(self, parts: tuple[Path, ...], display_name: str | None = None) -> Summary:
        """The summary of the GGUF model in ``parts``; raises ``GgufError`` (naming the file)
        where it cannot be read at all."""
        if not parts:
            raise GgufError("no model file to read")
        return self._get(parts, parts, lambda: _summarize_gguf(parts[0], display_name))

    def folder(self, folder: Path) -> Summary:
        return self._get((folder,), folder_files(folder), lambda: summarize_folder(folder))

    def _get(self, key_paths, files, make) -> Summary:
        key = json.dumps([str(p) for p in key_paths])
        now = stamps(files)
        entry = self.entries.get(key)
        if isinstance(entry, dict) and entry.get("stamps") == now:
            if "error" in entry:
                raise GgufError(entry["error"])
            try:
                return Summary.from_json(entry["summary"])
            except (KeyError, TypeError, ValueError):
                pass  # an entry from an older layout: read the file again
        try:
            summary = make()
        except GgufError as exc:
            self._put(key, {"stamps": now, "error": str(exc)})
            raise
        self._put(key, {"stamps": now, "summary": summary.to_json()})
        return summary

    def _put(self, key: str, entry: dict) -> None:
        self.entries[key] = entry
        self.changed = True

    def save(self) -> None:
        if not self.changed:
            return
        # Drop entries whose files are gone, so the cache does not grow forever.
        self.entries = {k: e for k, e in self.entries.items() if _files_exist(e)}
        try:
            write_json_atomic(self.path, {"format": FORMAT, "entries": self.entries})
            self.changed = False
        except OSError as exc:  # a read-only cache dir: listing still works, slower next time
            log.warning("could not save the model summaries (%s)", exc)


def _files_exist(entry) -> bool:
    try:
        return all(Path(s[0]).exists() for s in entry.get("stamps", []))
    except (AttributeError, IndexError, KeyError, TypeError, ValueError, OSError):
        return False  # an entry nobody wrote: dropped
