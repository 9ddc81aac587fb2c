"""The GGUF models already on this machine, for the picker: listed, imported, loaded.

Jobs for ``EngineHost.submit`` (the engine is imported inside them, on the worker):
``list_local`` finds LM Studio's, llama.cpp's, Ollama's and imported files and weighs each like a
catalog entry (engine.library.fit_rows); ``import_file`` registers one more (engine.library's
``import_model``) and lists again; ``load_local`` loads one from its file at precision "file"
with the drafter the library matched (or none: prompt lookup drafts).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, replace

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class LocalModels:
    """The local rows (engine.library.fit_rows.LocalFit, a FitResult and its LocalModel);
    ``added``: the path ``import_file`` registered (None for a plain listing)."""

    fits: tuple = ()
    added: str | None = None


@dataclass(frozen=True)
class ImportFailed:
    """A file ``import_file`` could not register: ``path`` and why (the library's reason)."""

    path: str
    reason: str

    @property
    def message(self) -> str:
        return f"Could not add {self.path}: {self.reason}"


def _fits(context: int | None):
    from engine.library import list_local_models
    from engine.library.fit_rows import local_fits
    from engine.models.loading.machine import detect_machine

    return tuple(local_fits(list_local_models(), detect_machine(), context))


def list_local(context: int | None = None):
    def run(ctx) -> None:
        try:
            ctx.emit(LocalModels(_fits(context)))
        except Exception:  # the catalog's rows still show; the log says why these did not
            log.exception("listing local models failed")
            ctx.emit(LocalModels(()))

    return run


def import_file(path: str, context: int | None = None):
    """Register ``path`` (a .gguf file, or any part of a split one) and list the local models
    again; a file the library refuses comes back as ImportFailed with its reason."""

    def run(ctx) -> None:
        from engine.gguf.reader import GgufError
        from engine.library import import_model

        try:
            model = import_model(path)
        except (GgufError, OSError) as exc:
            ctx.emit(ImportFailed(path, str(exc)))
            return
        ctx.emit(LocalModels(_fits(context), added=str(model.path)))

    return run


def load_local(local_fit, settings=None):
    """Load a local model from its file with the drafter the library matched; ``settings``: the
    model's own (precision, drafter choice, threads). A .gguf target loads at precision "file"
    only (its own quantized blocks): the settings' store offers no other (model_settings)."""
    from app.bridge import jobs

    precision = settings.precision if settings is not None and settings.precision else "file"
    if settings is not None:
        settings = replace(settings, precision=precision)

    def run(ctx) -> None:
        from engine.library import loadable_path

        model = local_fit.model
        drafting = model.drafting
        drafter = drafting.drafter if drafting is not None and drafting.kind == "model" else None
        target_path = loadable_path(model)  # an Ollama blob gets a .gguf link under Tandem's cache
        drafter_path = loadable_path(drafter) if drafter is not None else None
        jobs.load_models(str(target_path), str(drafter_path) if drafter_path else None, precision,
                         settings=settings)(ctx)

    return run
