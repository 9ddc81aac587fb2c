"""Local GGUF models as picker rows: each ``LocalModel`` weighed like a catalog entry.

The catalog's rows are ``engine.models.planning.fit.FitResult``s; a model found on this machine (LM
Studio, llama.cpp, Ollama, imported) becomes one too, so the picker sorts, filters and loads
both alike: its file is the variant (``engine.models.loading.gguf_sizes.local_variant``: size from the
file, precision "file"), its architecture comes from the GGUF header's metadata (the fast
header reader, engine.library.header), and its drafter is the one ``engine.library`` matched,
budgeted from its own file (or folder). ``FitResult.source`` names the app it came from.

Reads files (headers, the metadata cache): call it on a worker, never on the GUI thread.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from engine.gguf.reader import GgufError
from engine.library.header import one_line, read_header
from engine.library.local_model import DrafterCandidate, LocalModel
from engine.models.loading.gguf_sizes import local_variant
from engine.models.planning.architecture import (
    Architecture,
    ConfigError,
    architecture_from_config,
    estimate_params,
)
from engine.models.planning.catalog import (
    FILE_PRECISION,
    LOOKUP_SPEEDUP_PRIOR,
    CatalogEntry,
    read_config,
)
from engine.models.planning.fit import FitResult, assess
from engine.models.planning.hardware import Hardware
from engine.models.planning.variants import GgufVariant

log = logging.getLogger(__name__)

#: What a same-vocabulary draft model gives, before it has run here: the catalog's prior for the
#: default Qwen2.5-Coder pair (1.2x on prose, 1.7-1.9x on code, measured in design.md).
DRAFT_MODEL_SPEEDUP_PRIOR = (1.2, 1.9)
#: Ids of local rows start with this, so they never collide with a catalog id.
LOCAL_ID_PREFIX = "local:"


@dataclass(frozen=True)
class LocalFit:
    """A local model's picker row: ``fit`` (variant = the file's quant, source = where it was
    found) and ``model`` (its drafting: the drafter, or prompt lookup with the refusals)."""

    fit: FitResult
    model: LocalModel


def local_id(model: LocalModel) -> str:
    return LOCAL_ID_PREFIX + str(model.path)


def architecture_from_header(path: Path, display_name: str | None = None) -> Architecture:
    """A GGUF file's memory facts from its metadata (``<arch>.block_count`` ...), as a
    transformers config would state them; raises ConfigError / GgufError."""
    header = read_header(path, display_name)
    meta = header.metadata
    arch = str(meta.get("general.architecture") or "unknown")

    def key(name: str):
        return meta.get(f"{arch}.{name}")

    vocab = key("vocab_size") or (len(header.tokens) if header.tokens else None)
    if vocab is None and "token_embd.weight" in header.tensors:
        vocab = header.tensors["token_embd.weight"].shape[0]
    config = {
        "model_type": arch,
        "num_hidden_layers": key("block_count"),
        "hidden_size": key("embedding_length"),
        "intermediate_size": key("feed_forward_length"),
        "num_attention_heads": key("attention.head_count"),
        "num_key_value_heads": key("attention.head_count_kv"),
        "head_dim": key("attention.key_length"),
        "max_position_embeddings": key("context_length"),
        "sliding_window": key("attention.sliding_window"),
        "vocab_size": vocab,
        # No separate output matrix: the embedding serves as the output (tied).
        "tie_word_embeddings": "output.weight" not in header.tensors,
    }
    return architecture_from_config({k: v for k, v in config.items() if v is not None}, source=str(path))


def _drafter_budget(candidate: DrafterCandidate) -> tuple[Architecture | None, int, GgufVariant | None]:
    """(architecture, parameters, GGUF variant) of a drafter for the memory estimate."""
    if candidate.kind == "folder":
        config = read_config(Path(candidate.path))
        arch = architecture_from_config(config, source=str(candidate.path)) if config else None
        return arch, candidate.parameter_count or 0, None
    arch = architecture_from_header(candidate.path, candidate.name)
    params = candidate.parameter_count or estimate_params(arch)
    return arch, params, local_variant(candidate.path)


def local_entry(model: LocalModel) -> tuple[CatalogEntry, GgufVariant]:
    """A catalog entry standing for ``model`` (id ``local:<path>``, source = where it was
    found) and its file as the variant that runs. Raises GgufError / ConfigError / OSError."""
    arch = architecture_from_header(model.path, model.name if model.source == "ollama" else None)
    variant = local_variant(model.path)
    drafting = model.drafting
    drafter = drafting.drafter if drafting is not None and drafting.kind == "model" else None
    drafter_arch, drafter_params, drafter_variant = (None, 0, None)
    if drafter is not None:
        try:
            drafter_arch, drafter_params, drafter_variant = _drafter_budget(drafter)
        except (GgufError, ConfigError, OSError) as exc:  # budget it by its file size instead
            log.info("%s: drafter %s read as its file size (%s)", model.name, drafter.name, exc)
            drafter_params = drafter.parameter_count or 0
    entry = CatalogEntry(
        id=local_id(model),
        name=model.summary.title or model.name,
        family=model.architecture or arch.model_type,
        target_repo=model.name,
        drafter_repo=drafter.name if drafter is not None else None,
        drafter_kind="draft_model" if drafter is not None else "lookup",
        target_params=model.parameter_count or estimate_params(arch),
        drafter_params=drafter_params,
        license="unknown",
        gated=False,
        speedup_prior=DRAFT_MODEL_SPEEDUP_PRIOR if drafter is not None else LOOKUP_SPEEDUP_PRIOR,
        target_arch=arch,
        drafter_arch=drafter_arch,
        precisions=(FILE_PRECISION,),
        source=model.source,
        variants=(variant,),
        drafter_variants=(drafter_variant,) if drafter_variant is not None else (),
    )
    return entry, variant


@dataclass(frozen=True)
class Unweighed:
    """A local model that is no picker row: ``problem`` says why (the model's own, from its
    header, or what stopped weighing it)."""

    model: LocalModel
    problem: str


def weigh(model: LocalModel, hardware: Hardware, context: int | None = None) -> LocalFit | Unweighed:
    """``model`` assessed on ``hardware`` from its own file (precision "file"), or ``Unweighed``
    when Tandem cannot run it or weighing it fails: whatever its file holds, never an exception
    (one damaged file is one unweighed model, never the end of the rows)."""
    if not model.runnable:
        return Unweighed(model, model.problem)
    try:
        entry, variant = local_entry(model)
        return LocalFit(assess(entry, hardware, FILE_PRECISION, context, variant=variant), model)
    except (GgufError, ConfigError, OSError) as exc:
        problem = str(exc)
    except Exception as exc:  # noqa: BLE001 -- the file's bytes, not our state: name it and go on
        log.debug("weighing %s failed", model.path, exc_info=True)
        problem = f"{model.name} cannot be weighed ({one_line(exc)})"
    log.warning("%s: cannot weigh it for the picker (%s)", model.path, problem)
    return Unweighed(model, problem)


def local_fit(model: LocalModel, hardware: Hardware, context: int | None = None) -> LocalFit | None:
    """``model`` assessed on ``hardware`` from its own file (precision "file"), or None when
    Tandem cannot run it (``model.problem`` says why) or its header cannot be read."""
    row = weigh(model, hardware, context)
    return row if isinstance(row, LocalFit) else None


def local_rows(models: list[LocalModel], hardware: Hardware, context: int | None = None) -> list[LocalFit | Unweighed]:
    """``weigh`` of every model, in the library's order."""
    return [weigh(m, hardware, context) for m in models]


def local_fits(models: list[LocalModel], hardware: Hardware, context: int | None = None) -> list[LocalFit]:
    """``local_fit`` of every runnable model, in the library's order; the others are left out,
    each with a logged notice saying why."""
    fits = []
    for row in local_rows(models, hardware, context):
        if isinstance(row, LocalFit):
            fits.append(row)
        elif row.model.runnable is False:
            log.info("leaving out %s (%s)", row.model.path, row.problem)
    return fits
