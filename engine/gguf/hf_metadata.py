"""transformers' config and tokenizer of a GGUF file, made from the header engine.gguf already read.

``AutoConfig.from_pretrained(folder, gguf_file=name)`` and ``AutoTokenizer.from_pretrained``
(which needs a config to pick its class) both call ``load_gguf_checkpoint``, which re-reads the
whole header with gguf-py: ~8 s each for the default target, whose header holds 151,936 tokens
and 151,387 merges. Here the same steps run on engine.gguf.header's values (gguf-py's values,
parsed in milliseconds), with transformers' own tables and converters:

    checkpoint_dict   what ``load_gguf_checkpoint(path, return_tensors=False)`` returns
                      (its key renames, value parsing, architecture renames and defaults)
    read_config       the config class's ``from_dict`` on that dict's "config", as AutoConfig does
    read_tokenizer    ``get_gguf_tokenizer``'s dicts from our parse, ``convert_gguf_tokenizer``,
                      then the class AutoTokenizer picks for that config, given the backend

Only the steps transformers takes for every architecture are repeated here; a file whose
architecture takes one of its special branches (T5, StableLM, gpt-oss, LFM2, MiniMax, Gemma 4)
raises ``NotHandledHere``, and so does anything else this does not reproduce, so the caller can
use transformers' own path for it. tests/engine/gguf/test_gguf_hf_metadata.py checks the results
against that path.
"""
from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TypeVar

from engine.gguf.header import GgufError, LongArray, read_part

log = logging.getLogger(__name__)
T = TypeVar("T")


class NotHandledHere(ValueError):
    """A file (or folder) this module does not reproduce transformers' result for."""


# Substrings of general.architecture for which load_gguf_checkpoint takes a branch of its own.
_SPECIAL_ARCHITECTURES = ("t5", "stablelm", "gpt_oss", "gpt-oss", "minimax-m2")
# model_type values it post-processes beyond the gemma3 rename.
_SPECIAL_MODEL_TYPES = ("gemma4", "lfm2", "minimax_m2")
# Files next to a GGUF file that change what AutoTokenizer builds for it.
_TOKENIZER_FILES = ("tokenizer_config.json", "tokenizer.json")


def checkpoint_dict(metadata: Mapping[str, object], tensor_names: Iterable[str]) -> dict:
    """``load_gguf_checkpoint(path, return_tensors=False)`` for a file with this metadata (in file
    order, as engine.gguf.header reads it) and these tensors. Arrays left as ``LongArray`` stay
    so in the result (pass them whole where they matter: the tokenizer's)."""
    from transformers.integrations import GGUF_CONFIG_DEFAULTS_MAPPING
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES, GGUF_TO_TRANSFORMERS_MAPPING

    parsed: dict[str, dict] = {group: {} for group in GGUF_TO_TRANSFORMERS_MAPPING}
    architecture = _as_gguf_py(metadata["general.architecture"])
    if not isinstance(architecture, str):
        raise NotHandledHere(f"general.architecture is {architecture!r}, not a string")
    model_name = [metadata["general.name"]] if "general.name" in metadata else []
    if any(special in architecture for special in _SPECIAL_ARCHITECTURES):
        raise NotHandledHere(f"transformers reads '{architecture}' GGUF files with a branch of its own")
    updated = "mistral" if "llama" in architecture and "mistral" in model_name else architecture
    if "qwen2moe" in architecture:
        updated = "qwen2_moe"
    elif "qwen3moe" in architecture:
        updated = "qwen3_moe"
    if architecture not in GGUF_SUPPORTED_ARCHITECTURES and updated not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ValueError(f"GGUF model with architecture {architecture} is not supported yet.")

    config = parsed["config"]
    # llama.cpp writes the output projection only where it is not the embedding matrix
    config["tie_word_embeddings"] = "output.weight" not in set(tensor_names) or architecture in ("falcon", "bloom")
    defaults = GGUF_CONFIG_DEFAULTS_MAPPING.get(updated, GGUF_CONFIG_DEFAULTS_MAPPING.get(architecture) or {})
    for key, value in defaults.items():
        config.setdefault(key, value)

    for gguf_key, raw in metadata.items():
        gguf_key = gguf_key.replace(architecture, updated)
        prefix, _, config_key = gguf_key.partition(".")
        value = _as_gguf_py(raw)
        if isinstance(value, str) and architecture in value:
            value = value.replace(architecture, updated)
        for group, renames in GGUF_TO_TRANSFORMERS_MAPPING.items():
            if prefix in renames and config_key in renames[prefix]:
                renamed = renames[prefix][config_key]
                if renamed is not None and renamed != -1:
                    parsed[group][renamed] = value

    if config["model_type"] in _SPECIAL_MODEL_TYPES:
        raise NotHandledHere(f"transformers post-processes '{config['model_type']}' GGUF configs")
    if config["model_type"] == "gemma3":  # the file holds the text backbone only
        config["model_type"] = "gemma3_text"
    if "vocab_size" not in config and "tokens" in parsed["tokenizer"]:
        tokens = parsed["tokenizer"]["tokens"]
        config["vocab_size"] = tokens.length if isinstance(tokens, LongArray) else len(tokens)
    return parsed


def config_dict(metadata: Mapping[str, object], tensor_names: Iterable[str]) -> dict:
    """The "config" part of ``checkpoint_dict``: what AutoConfig builds a GGUF file's config from."""
    config = checkpoint_dict(metadata, tensor_names)["config"]
    long = [key for key, value in config.items() if isinstance(value, LongArray)]
    if long:
        raise NotHandledHere(f"config values {', '.join(long)} are arrays engine.gguf keeps as their length")
    return config


def read_config(path: Path, metadata: Mapping[str, object], tensor_names: Iterable[str]):
    """What ``AutoConfig.from_pretrained(path.parent, gguf_file=path.name)`` returns."""
    from transformers import CONFIG_MAPPING

    values = config_dict(metadata, tensor_names)
    model_type = values["model_type"]
    if model_type not in CONFIG_MAPPING:
        raise NotHandledHere(f"transformers has no config class for model type '{model_type}'")
    if model_type == "mistral" and "layer_types" in values:
        raise NotHandledHere("AutoConfig reads such a mistral config as ministral")
    return CONFIG_MAPPING[model_type].from_dict(values, name_or_path=str(path.parent))


def tokenizer_keys() -> tuple[str, ...]:
    """The metadata keys transformers builds a GGUF tokenizer from (to read whole)."""
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING

    return tuple(f"tokenizer.{key}" for renames in GGUF_TOKENIZER_MAPPING.values() for key in renames)


def tokenizer_dicts(metadata: Mapping[str, object]) -> tuple[str, dict, dict]:
    """``get_gguf_tokenizer(path)`` (architecture, tokenizer dict, tokenizer config) from metadata
    holding the ``tokenizer_keys()`` whole."""
    from transformers.integrations.gguf import GGUF_TOKENIZER_MAPPING

    long = [key for key in tokenizer_keys() if isinstance(metadata.get(key), LongArray)]
    if long:
        raise NotHandledHere(f"{', '.join(long)} must be read whole to build the tokenizer")
    grouped = {group: {name: metadata[f"tokenizer.{key}"] for key, name in renames.items() if f"tokenizer.{key}" in metadata}
               for group, renames in GGUF_TOKENIZER_MAPPING.items()}
    tokenizer, tokenizer_config = grouped["tokenizer"], grouped["tokenizer_config"]
    tokenizer_type = tokenizer.get("tokenizer_type")
    if tokenizer_type == "llama":  # llama.cpp adds BOS to a sentencepiece vocabulary that does not say otherwise
        tokenizer_config.setdefault("add_bos_token", True)
    elif tokenizer_type == "gemma4":
        tokenizer_config["add_bos_token"] = False
    for name, key in (("bos_token", "bos_token_id"), ("eos_token", "eos_token_id"),
                      ("unk_token", "unknown_token_id"), ("pad_token", "padding_token_id")):
        token_id = metadata.get(f"tokenizer.ggml.{key}")
        tokenizer_config[name] = tokenizer["tokens"][token_id] if token_id is not None else None
    return str(metadata["general.architecture"]), tokenizer, tokenizer_config


def read_tokenizer(path: Path, tensor_names: Iterable[str]):
    """What ``AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)`` returns, the
    header read once more by engine.gguf.header with the vocabulary and merges whole (~0.1 s)."""
    from transformers.integrations.gguf import convert_gguf_tokenizer

    path = Path(path)
    present = [name for name in _TOKENIZER_FILES if (path.parent / name).exists()]
    if present:  # transformers would read them too
        raise NotHandledHere(f"{path.parent} also holds {', '.join(present)}")
    metadata = read_part(path, long_arrays=tokenizer_keys()).metadata
    tokenizer_class = _tokenizer_class(config_dict(metadata, tensor_names))
    architecture, tokenizer_dict, tokenizer_config = tokenizer_dicts(metadata)
    backend, extra = convert_gguf_tokenizer(architecture, tokenizer_dict)
    # As the class's constructor does with gguf_file: the GGUF's tokenizer replaces the one the
    # class builds, and the dicts' values its defaults.
    return tokenizer_class.from_pretrained(str(path.parent), gguf_file=path.name, tokenizer_object=backend,
                                           **tokenizer_config, **extra)


# -- pieces ------------------------------------------------------------------------------------


def _as_gguf_py(value):
    """A value of engine.gguf.header as load_gguf_checkpoint has it from gguf-py: a one-item
    array is that item."""
    if isinstance(value, list) and len(value) == 1:
        return value[0]
    return value


def _tokenizer_class(values: dict):
    """The class AutoTokenizer picks for a GGUF file with this config dict (and no tokenizer
    files beside it): the one registered for the config's class."""
    import fnmatch

    from transformers import AutoConfig
    from transformers.models.auto.tokenization_auto import (
        MODEL_IDS_TO_TOKENIZERS_BACKEND,
        TOKENIZER_MAPPING,
        TokenizersBackend,
    )

    config = AutoConfig.for_model(**values)
    name = getattr(config, "_name_or_path", None)
    name = name.lower() if isinstance(name, str) else ""
    if any(fnmatch.fnmatch(name, pattern) for pattern in MODEL_IDS_TO_TOKENIZERS_BACKEND):
        raise NotHandledHere(f"AutoTokenizer special-cases the model '{name}'")
    if getattr(config, "tokenizer_class", None):
        raise NotHandledHere(f"the config names its tokenizer class ({config.tokenizer_class})")
    tokenizer_class = TOKENIZER_MAPPING.get(type(config), TokenizersBackend)
    if tokenizer_class is None or tokenizer_class.__name__ == "MistralCommonBackend":
        raise NotHandledHere(f"AutoTokenizer picks {tokenizer_class} for {type(config).__name__} with extra checks")
    return tokenizer_class


def fast_or_transformers(fast: Callable[[], T], transformers_path: Callable[[], T], name: str, what: str) -> T:
    """``fast()``, else transformers' own GGUF path (anything the fast one cannot do, it still
    can); a file neither can read is a GgufError naming it."""
    try:
        return fast()
    except Exception as exc:
        log.info("%s: %s through transformers' GGUF reader (%s: %s)", name, what, type(exc).__name__, exc)
    try:
        return transformers_path()
    except (ValueError, KeyError, TypeError) as error:
        raise GgufError(f"{name}: transformers could not build its {what} ({error})") from error
