"""The demo's precision combo, named for the loaded model as the engine names precisions
(engine.models.planning.precision_labels): "As in the file (Q4_K_M)" first for a model from a GGUF file,
"dequantized" / "re-quantized" for the precisions that start from its converted copy, plain
names for a model that was 16-bit to begin with."""
from __future__ import annotations

import logging
from dataclasses import replace

from app.picker.model_settings import DEFAULT_PAIR, precision_choices

log = logging.getLogger(__name__)


def loaded_choices(target_path: str) -> list[tuple[str, str]]:
    """(label, precision) pairs for the model loaded from ``target_path``: the default pair's own
    list; a .gguf file runs at "file" alone; a folder at the four folder precisions."""
    from engine.models.loading import default_pair
    from engine.models.loading.file_precision import source_quantization
    from engine.models.planning.precision_labels import choices

    if target_path and default_pair.is_default_target(target_path):
        return precision_choices(DEFAULT_PAIR)
    if target_path.lower().endswith(".gguf"):
        return choices(file_quantization(target_path), with_file=True)[:1]
    return choices(source_quantization(target_path, open_file=False) if target_path else None)


def reload_job(loaded, precision: str, pair_settings):
    """The job that loads the loaded model again at ``precision``: the default pair through its
    own paths (its GGUF file at "file", its converted folder otherwise; ``pair_settings`` its
    model settings), any other model from the same files."""
    from app.bridge import jobs
    from engine.models.loading import default_pair

    if default_pair.is_default_target(loaded.target_path):
        return jobs.load_models(None, None, precision, settings=replace(pair_settings, precision=precision))
    return jobs.load_models(loaded.target_path, loaded.drafter_path or None, precision,
                            race_with=loaded.draft_model_path if loaded.race_against else None)


def offer_precisions(combo, loaded) -> None:
    """Refill ``combo`` with the loaded model's precisions, the loaded one current. Refilling is
    not a choice: no signal fires, so nothing reloads and the app's precision stays."""
    combo.blockSignals(True)
    try:
        combo.clear()
        for label, value in loaded_choices(loaded.target_path):
            combo.addItem(label, value)
        combo.setCurrentIndex(max(0, combo.findData(loaded.precision)))
    finally:
        combo.blockSignals(False)


def file_quantization(path: str) -> str:
    """A loaded .gguf file's quantization for its label (its header is in the metadata cache by
    then, and torch loaded); "" if it cannot be read."""
    from engine.models.loading.file_precision import quantization_of

    try:
        return quantization_of(path)
    except Exception as exc:  # only a label: the model itself loaded
        log.warning("could not read the quantization of %s: %s", path, exc)
        return ""
