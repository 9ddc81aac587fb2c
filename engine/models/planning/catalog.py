"""The model catalog: which targets Tandem offers, with which drafter, and the architecture facts
that memory estimates need (engine/models/planning/architecture.py). The data lives in resources/catalog.json;
this module reads it.

A config.json at hand (a local model folder, Tandem's converted default pair, or the Hugging Face
cache — never the network) wins over the catalog: ``load_catalog()`` applies it, falling back to
catalog values for fields the config lacks, and safetensors headers give exact parameter counts.
A model outside the catalog can be described from its config alone (``entry_from_config``),
drafted by prompt lookup.

No torch here: the app reads the catalog on the GUI thread.
"""
from __future__ import annotations

import functools
import json
import logging
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from engine.core.paths import RESOURCES
from engine.core.settings import PRECISION_ALIASES as OLDER_PRECISION_NAMES
from engine.models.planning.architecture import (  # noqa: F401  (re-exported: the catalog's vocabulary)
    KNOWN_MODEL_TYPES,
    Architecture,
    AttentionGroup,
    ConfigError,
    architecture_from_config,
    estimate_params,
)
from engine.models.planning.local_config import local_model_dir, read_config, safetensors_params
from engine.models.planning.variants import GgufVariant, VariantError, parse_variants

log = logging.getLogger(__name__)

CATALOG_PATH = RESOURCES / "catalog.json"
DrafterKind = Literal["draft_model", "assistant", "mtp", "lookup", "eagle3", "dflash"]
DRAFTER_KINDS = ("draft_model", "assistant", "mtp", "lookup", "eagle3", "dflash")
# Drafters made for one target (engine.drafters.made_for_target): a checkpoint of their own,
# fetched beside the target, that reads the target's hidden states instead of the tokens alone.
MADE_FOR_TARGET_KINDS = ("eagle3", "dflash")
# Kinds whose drafter is a checkpoint of its own (weights to download and to hold).
SEPARATE_DRAFTER_KINDS = ("draft_model", "assistant", *MADE_FOR_TARGET_KINDS)

# Bits per weight. int8 / int4 are the GGUF block formats Q8_0 (32 weights + one fp16 scale =
# 34 bytes) and Q4_0 (16 bytes of nibbles + one fp16 scale = 18 bytes): 8.5 and 4.5 bits.
PRECISION_BITS: dict[str, float] = {"fp32": 32, "bf16": 16, "fp16": 16, "int8": 8.5, "int4": 4.5}
# The precisions' older names (engine.core.settings), and torch's dtype names.
PRECISION_ALIASES = {**OLDER_PRECISION_NAMES, "float32": "fp32", "bfloat16": "bf16", "float16": "fp16"}
# A GGUF file computing on its own quantization (engine.gguf): its bytes come from the file
# (engine.models.planning.variants), not from a bits-per-weight figure.
FILE_PRECISION = "file"
DEFAULT_PRECISIONS = ("bf16", "fp32", "int8", "int4")
# Prompt lookup needs no model; its gain depends on how much the output repeats the prompt
# (large for edits and rewrites, small for prose).
LOOKUP_SPEEDUP_PRIOR = (1.0, 1.6)


class CatalogError(ValueError):
    """The catalog file itself is wrong (a bug in resources/catalog.json, not in user input)."""


def canonical_precision(precision: str) -> str:
    name = PRECISION_ALIASES.get(precision.lower(), precision.lower())
    if name not in PRECISION_BITS and name != FILE_PRECISION:
        raise ValueError(f"unknown precision {precision!r}; choose from "
                         f"{', '.join([*PRECISION_BITS, 'exact', 'fast', FILE_PRECISION])}")
    return name


def weight_bytes(params: int, precision: str) -> int:
    name = canonical_precision(precision)
    if name == FILE_PRECISION:
        raise ValueError("precision 'file' has no bytes per parameter: a GGUF variant's size is its file's")
    return math.ceil(params * PRECISION_BITS[name] / 8)


@dataclass(frozen=True)
class CatalogEntry:
    """A target and its drafter. ``target_params`` / ``drafter_params`` are totals as loaded;
    for an "mtp" drafter the heads are part of the target (drafter_params 0), for "lookup" there
    is no drafter model at all."""

    id: str
    name: str
    family: str
    target_repo: str
    drafter_repo: str | None
    drafter_kind: str
    target_params: int
    drafter_params: int
    license: str
    gated: bool
    speedup_prior: tuple[float, float]
    target_arch: Architecture
    drafter_arch: Architecture | None = None
    precisions: tuple[str, ...] = DEFAULT_PRECISIONS
    source: str = "hub"  # "hub", "pypi" (the offline default pair) or "local"
    target_local: str | None = None  # folder name under Tandem's cache (pypi entries)
    drafter_local: str | None = None
    download_bytes: int | None = None
    notes: tuple[str, ...] = field(default=(), compare=False)
    #: The target's and the drafter's GGUF builds (engine.models.planning.variants), smallest quant first;
    #: () where none exists and the model runs from safetensors only.
    variants: tuple[GgufVariant, ...] = ()
    drafter_variants: tuple[GgufVariant, ...] = ()
    #: Of ``drafter_params``, those of a token embedding a made-for-target drafter ships (most
    #: EAGLE-3 checkpoints carry a copy of the target's; the others read the target's own).
    drafter_embedding_params: int = 0

    # The target's architecture facts, flat, for callers that only care about the target.
    @property
    def num_layers(self) -> int:
        return self.target_arch.num_layers

    @property
    def full_attention_layers(self) -> int:
        return self.target_arch.full_attention_layers

    @property
    def sliding_window_layers(self) -> int:
        return self.target_arch.sliding_window_layers

    @property
    def sliding_window(self) -> int | None:
        return self.target_arch.sliding_window

    @property
    def kv_heads(self) -> int:
        return self.target_arch.kv_heads

    @property
    def head_dim(self) -> int:
        return self.target_arch.head_dim

    @property
    def vocab_size(self) -> int:
        return self.target_arch.vocab_size

    @property
    def hidden_size(self) -> int:
        return self.target_arch.hidden_size

    @property
    def max_context(self) -> int | None:
        return self.target_arch.max_context

    @property
    def conservative(self) -> bool:
        return self.target_arch.conservative or bool(self.drafter_arch and self.drafter_arch.conservative)

    def weight_bytes(self, precision: str) -> int:
        return weight_bytes(self.target_params, precision)

    def drafter_weight_bytes(self, precision: str) -> int:
        return weight_bytes(self.drafter_params, precision) if self.drafter_kind in SEPARATE_DRAFTER_KINDS else 0


# -- reading the catalog -----------------------------------------------------------------------


def _require(record: dict, key: str, where: str, kind: type = int):
    if key not in record:
        raise CatalogError(f"catalog {where}: missing {key!r}")
    value = record[key]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise CatalogError(f"catalog {where}: {key!r} must be {kind.__name__}, not {value!r}")
    return value


def _group(data: dict, where: str) -> AttentionGroup:
    return AttentionGroup(
        layers=_require(data, "layers", where),
        kv_heads=_require(data, "kv_heads", where),
        head_dim=_require(data, "head_dim", where),
        window=data.get("window"),
    )


def _architecture(repo: str, record: dict) -> Architecture:
    where = f"model {repo}"
    attention = _require(record, "attention", where, dict)
    if "full" not in attention:
        raise CatalogError(f"catalog {where}: attention needs a 'full' group")
    sliding = _group(attention["sliding"], where + " sliding") if "sliding" in attention else None
    if sliding and not sliding.window:
        raise CatalogError(f"catalog {where}: a sliding group needs a window")
    source = record.get("source")
    return Architecture(
        model_type=_require(record, "model_type", where, str),
        num_layers=_require(record, "layers", where),
        hidden_size=_require(record, "hidden_size", where),
        vocab_size=_require(record, "vocab_size", where),
        full=_group(attention["full"], where + " full"),
        sliding=sliding,
        intermediate_size=record.get("intermediate_size"),
        attention_heads=record.get("heads"),
        max_context=record.get("max_context"),
        kv_shared_layers=record.get("kv_shared_layers", 0),
        tie_word_embeddings=record.get("tie_word_embeddings", True),
        source="catalog",
        notes=(source,) if source else (),
    )


@functools.lru_cache(maxsize=4)
def _read(path: str) -> tuple[CatalogEntry, ...]:
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise CatalogError(f"cannot read the model catalog {path}: {exc}") from exc
    models = data.get("models")
    if not isinstance(models, dict) or not isinstance(data.get("entries"), list):
        raise CatalogError(f"{path}: expected 'models' (object) and 'entries' (list)")
    entries = []
    seen: set[str] = set()
    for raw in data["entries"]:
        where = f"entry {raw.get('id', '?')}"
        entry_id = _require(raw, "id", where, str)
        if entry_id.lower() in seen:
            raise CatalogError(f"catalog: duplicate id {entry_id!r}")
        seen.add(entry_id.lower())
        kind = _require(raw, "drafter_kind", where, str)
        if kind not in DRAFTER_KINDS:
            raise CatalogError(f"catalog {where}: drafter_kind must be one of {DRAFTER_KINDS}, not {kind!r}")
        target_repo = _require(raw, "target", where, str)
        if target_repo not in models:
            raise CatalogError(f"catalog {where}: target {target_repo!r} is not described under 'models'")
        target = models[target_repo]
        drafter_repo = raw.get("drafter")
        if (drafter_repo is None) != (kind in ("mtp", "lookup")):
            raise CatalogError(f"catalog {where}: a {kind} drafter {'has no' if kind in ('mtp', 'lookup') else 'needs a'} drafter repo")
        drafter = models.get(drafter_repo) if drafter_repo else None
        if drafter_repo and drafter is None:
            raise CatalogError(f"catalog {where}: drafter {drafter_repo!r} is not described under 'models'")
        low, high = _require(raw, "speedup_prior", where, list)
        try:
            variants = parse_variants(target.get("gguf"), f"model {target_repo}")
            drafter_variants = parse_variants(drafter.get("gguf"), f"model {drafter_repo}") if drafter else ()
        except VariantError as exc:
            raise CatalogError(f"{where}: {exc}") from None
        notes = tuple(n for n in (raw.get("speedup_note"),) if n)
        entries.append(
            CatalogEntry(
                id=entry_id,
                name=_require(raw, "name", where, str),
                family=_require(raw, "family", where, str),
                target_repo=target_repo,
                drafter_repo=drafter_repo,
                drafter_kind=kind,
                target_params=_require(target, "params", f"model {target_repo}"),
                drafter_params=drafter["params"] if drafter else 0,
                license=target.get("license", "unknown"),
                # Using the pair needs access to both checkpoints.
                gated=bool(target.get("gated")) or bool(drafter and drafter.get("gated")),
                speedup_prior=(float(low), float(high)),
                target_arch=_architecture(target_repo, target),
                drafter_arch=_architecture(drafter_repo, drafter) if drafter else None,
                precisions=tuple(target.get("precisions", DEFAULT_PRECISIONS)),
                source=raw.get("source", "hub"),
                target_local=target.get("local_name"),
                drafter_local=drafter.get("local_name") if drafter else None,
                download_bytes=target.get("download_bytes"),
                notes=notes,
                variants=variants,
                drafter_variants=drafter_variants,
                drafter_embedding_params=int(drafter.get("embedding_params", 0)) if drafter else 0,
            )
        )
    return tuple(entries)


def load_catalog(path: Path | None = None, local_configs: bool = True) -> list[CatalogEntry]:
    """Every catalog entry, in catalog order. With ``local_configs``, config.json files and
    safetensors headers found on this machine override the catalog's numbers."""
    entries = list(_read(str(path or CATALOG_PATH)))
    return [with_local_config(e) for e in entries] if local_configs else entries


def find_entry(id_or_repo: str, entries: list[CatalogEntry] | None = None) -> CatalogEntry | None:
    """The entry whose id or target repo is ``id_or_repo`` (case-insensitive), else None."""
    key = id_or_repo.strip().lower()
    for entry in entries if entries is not None else load_catalog():
        if key in (entry.id.lower(), entry.target_repo.lower()):
            return entry
    return None


# -- config.json at hand (engine/models/planning/local_config.py finds and reads it) ----------------------


def with_local_config(entry: CatalogEntry) -> CatalogEntry:
    """``entry`` with the numbers of any config.json / safetensors found on this machine."""
    updates: dict[str, Any] = {}
    notes = list(entry.notes)
    for role, repo, local, arch_key, params_key in (
        ("target", entry.target_repo, entry.target_local, "target_arch", "target_params"),
        ("drafter", entry.drafter_repo, entry.drafter_local, "drafter_arch", "drafter_params"),
    ):
        folder = local_model_dir(repo, local)
        if folder is None:
            continue
        config = read_config(folder)
        if config is None:
            continue
        try:
            arch = architecture_from_config(config, getattr(entry, arch_key), source=str(folder / "config.json"))
        except ConfigError as exc:
            notes.append(f"{role}: {exc}; catalog values kept")
            continue
        updates[arch_key] = arch
        params = safetensors_params(folder)
        if params:
            updates[params_key] = params
        notes.append(f"{role}: numbers from {folder}")
    if not updates:
        return entry
    return replace(entry, notes=tuple(notes), **updates)


def entry_from_config(repo: str, config: dict, params: int | None = None, name: str | None = None) -> CatalogEntry:
    """A catalog entry for a model we don't list, drafted by prompt lookup (the fallback that
    needs no drafter model). ``params`` defaults to the safetensors count or an estimate."""
    arch = architecture_from_config(config, source=f"{repo} config.json")
    notes = list(arch.notes)
    if params is None:
        params = estimate_params(arch, config)
        notes.append("parameter count estimated from the config's shape")
    return CatalogEntry(
        id=repo.lower().replace("/", "--"),
        name=name or repo.rsplit("/", 1)[-1],
        family=arch.model_type,
        target_repo=repo,
        drafter_repo=None,
        drafter_kind="lookup",
        target_params=params,
        drafter_params=0,
        license="unknown",
        gated=False,
        speedup_prior=LOOKUP_SPEEDUP_PRIOR,
        target_arch=arch,
        source="local",
        notes=tuple(notes),
    )
