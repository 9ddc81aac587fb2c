"""Drafters made for one target (EAGLE-3, DFlash): recognising their folders and loading the
right one. Both read only the inputs of a few of the target's layers, which every runner that
computes its own layers keeps (engine.models.runners), so the target keeps its fastest runner."""
from __future__ import annotations

from pathlib import Path

from engine.drafters.base import DrafterMismatch
from engine.drafters.dflash import DFlashDrafter, load_dflash_drafter
from engine.drafters.eagle3 import Eagle3Drafter, load_eagle3_drafter
from engine.models.planning.local_config import read_config
from engine.models.planning.speculators_config import SpeculatorError, is_speculator_config, read_speculator

MADE_FOR_TARGET = (Eagle3Drafter, DFlashDrafter)


def is_made_for_target_folder(path: Path | str) -> bool:
    folder = Path(path)
    return folder.is_dir() and (folder / "config.json").is_file() and is_speculator_config(read_config(folder))


def load_made_for_target(folder: Path, target_model, target_name: str, target_names: tuple[str, ...] = (),
                         quantize: bool = False) -> Eagle3Drafter | DFlashDrafter:
    try:
        spec = read_speculator(folder)
    except SpeculatorError as exc:
        raise DrafterMismatch(str(exc)) from exc
    if spec.algorithm == "dflash":
        return load_dflash_drafter(Path(folder), spec, target_model, target_name, target_names, quantize=quantize)
    return load_eagle3_drafter(Path(folder), target_model, target_name, target_names, quantize=quantize)
