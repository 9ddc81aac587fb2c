"""Tiny random models and a real byte-level BPE tokenizer, built offline in about a second.

Used by the tests, the app's self-test and anywhere a real model is not needed: speculative
decoding's guarantees (greedy identity, exact sampling law) hold for any weights.
"""
from __future__ import annotations

from pathlib import Path

import torch

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_CORPUS = [
    "def add(a, b):\n    return a + b\n",
    "The quick brown fox jumps over the lazy dog. Speculative decoding is lossless.",
    "for i in range(10):\n    print(i * i)\n",
    "Résumé, naïve café — 東京 and emoji 🙂 are bytes too.",
] * 20


def build_tokenizer(vocab_size: int = 512):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>"
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def build_model(vocab_size: int, hidden: int = 64, layers: int = 2, seed: int = 0, max_positions: int = 512):
    """A random Qwen2-architecture causal LM (the default pair's architecture)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden,
        intermediate_size=hidden * 2,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        # A wide init and untied head give confident, varied predictions, like a trained model's
        # (the default 0.02 gives near-uniform logits and degenerate repetition).
        initializer_range=0.5,
        tie_word_embeddings=False,
        eos_token_id=2,
        bos_token_id=None,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


def perturbed_copy(model, noise: float, seed: int):
    """A drafter that agrees with ``model`` often but not always: its weights plus Gaussian
    noise of ``noise`` x each tensor's std (0.01 gives ~50% greedy acceptance)."""
    import copy

    drafter = copy.deepcopy(model)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in drafter.parameters():
            p.add_(torch.randn(p.shape, generator=gen).to(p.dtype) * noise * p.float().std())
    return drafter


def build_pair(seed: int = 0, dtype: torch.dtype = torch.float32, drafter_noise: float = 0.01):
    """(tokenizer, target, drafter) sharing one vocabulary: a random 4-layer target and a
    perturbed copy of it as drafter, so acceptance is partial like a real pair's."""
    tokenizer = build_tokenizer()
    target = build_model(len(tokenizer), hidden=64, layers=4, seed=seed).to(dtype)
    drafter = perturbed_copy(target, drafter_noise, seed + 1000)
    return tokenizer, target, drafter


def save_pair(directory: Path, seed: int = 0) -> tuple[Path, Path]:
    """Write a tiny target and drafter as loadable model folders; returns their paths."""
    tokenizer, target, drafter = build_pair(seed)
    paths = []
    for name, model in (("tiny-target", target), ("tiny-drafter", drafter)):
        path = Path(directory) / name
        model.save_pretrained(path)
        tokenizer.save_pretrained(path)
        paths.append(path)
    return paths[0], paths[1]
