"""Loading a model folder (safetensors + tokenizer) at the precision a mode asks for."""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.fast_linear import accelerate_linears
from engine.placement import check_fits, dtype_for, pick_device  # noqa: F401  (pick_device, dtype_for: re-exported)
from engine.settings import Precision

log = logging.getLogger(__name__)


@dataclass
class LoadedModel:
    name: str
    model: torch.nn.Module
    tokenizer: object
    device: torch.device
    dtype: torch.dtype
    seconds: float


def read_config(path: Path) -> dict:
    """A model folder's config.json as a dict (no transformers import)."""
    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model folder (no config.json)")
    return json.loads((path / "config.json").read_text())


def load_model(path: Path, precision: Precision = "fast", device: str = "auto", fast_kernels: bool = True,
               role: str = "target", with_tokenizer: bool = True, check_memory: bool = True) -> LoadedModel:
    """Load a model folder. ``fast_kernels`` routes bf16 CPU linears through kernels.linear;
    ``role`` is "target" (batch-invariant kernels everywhere) or "drafter". Drafters that ship
    no tokenizer (Gemma 4 assistants) load with ``with_tokenizer=False`` (tokenizer None).
    ``check_memory``: on a GPU, refuse with ``placement.DoesNotFit`` when the model would not fit
    its free memory (the CPU is never checked)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"{path} is not a model folder (no config.json)")
    dev = pick_device(device)
    dtype = dtype_for(precision, dev)
    if check_memory and dev.type != "cpu":
        check_fits(path, None, dtype, dev)
    start = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(dev).eval()
    if fast_kernels:
        accelerate_linears(model, batch_invariant=role == "target")
    tokenizer = AutoTokenizer.from_pretrained(path) if with_tokenizer else None
    seconds = time.perf_counter() - start
    log.info("loaded %s on %s as %s in %.1fs", path.name, dev, dtype, seconds)
    return LoadedModel(path.name, model, tokenizer, dev, dtype, seconds)


def same_vocabulary(target_tokenizer, drafter_tokenizer) -> bool:
    """A draft model must map ids to the same strings as the target (same tokenizer)."""
    return target_tokenizer.get_vocab() == drafter_tokenizer.get_vocab()
