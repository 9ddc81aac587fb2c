"""Output held to a JSON schema (OpenAI's ``response_format``), speculation still lossless.

The grammar engine is llguidance: it compiles a JSON schema into a token-level parser and
computes the set of tokens allowed next in ~0.1 ms over a 152k-token vocabulary, with limits
on what a hostile schema may cost, and no dependencies (xgrammar needs triton; outlines-core
builds a regex index over the vocabulary per schema, seconds for one of any size).

Where the constraint acts, and why there only:

    the target     every row of logits the decode loop chooses or verifies from is masked by
                   the parser's state after the tokens before that row (``mask``): the output
                   is a draw from the constrained target distribution, plain or speculative
    the drafter    left as it is. Speculative sampling is lossless for any draft distribution,
                   so an unconstrained draft token is simply rejected where the grammar forbids
                   it (its masked target probability is 0). Greedy drafts are cut at the first
                   forbidden token (``allowed_prefix``): it would be rejected anyway, and the
                   verification pass is shorter. (Sampled drafts are not cut: that would draw
                   the next token from the target instead of the residual and bias the output.)

The parser's state advances only with tokens the decode loop commits (``accept``).
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence

import torch

from engine.core.settings import JSON_WHITESPACE, InvalidRequest, OutputFormat

# A schema is a request field: bounded like the rest of the body, far above real ones.
MAX_SCHEMA_CHARS = 256 * 1024

_tokenizers: dict[tuple[int, int, tuple[int, ...]], object] = {}
_tokenizers_lock = threading.Lock()


def grammar_for(output_format: OutputFormat) -> str:
    """llguidance's grammar for ``output_format`` (ValueError: the schema is not a JSON object)."""
    import llguidance

    if output_format.kind == "lark":
        return llguidance.LLMatcher.grammar_from_lark(output_format.schema)
    schema = json.loads(output_format.schema) if output_format.schema else {"type": "object"}
    return llguidance.LLMatcher.grammar_from_json_schema(schema, overrides={"whitespace_pattern": JSON_WHITESPACE})


def check_output_format(output_format: OutputFormat) -> None:
    """Raise InvalidRequest where the schema is too large or cannot be compiled (it names why)."""
    import llguidance

    if len(output_format.schema) > MAX_SCHEMA_CHARS:
        raise InvalidRequest(f"the schema has {len(output_format.schema):,} characters; at most "
                             f"{MAX_SCHEMA_CHARS:,}")
    try:
        grammar = grammar_for(output_format)
    except ValueError as exc:
        raise InvalidRequest(f"the JSON schema is not valid: {exc}") from None
    error = llguidance.LLMatcher.validate_grammar(grammar)
    if error:
        raise InvalidRequest(f"the JSON schema cannot be used: {error}")


def _llg_tokenizer(tokenizer, n_vocab: int, eos_ids: Iterable[int]):
    """The tokenizer as llguidance reads it (~1-2 s to build: kept per tokenizer and width)."""
    import llguidance.hf

    eos = tuple(sorted(eos_ids))
    key = (id(tokenizer), n_vocab, eos)
    with _tokenizers_lock:
        held = _tokenizers.get(key)
        if held is None or held[0] is not tokenizer:
            held = (tokenizer, llguidance.hf.from_tokenizer(tokenizer, n_vocab=n_vocab, eos_token=list(eos) or None))
            _tokenizers[key] = held
    return held[1]


class GrammarConstraint:
    """The parser of one request. ``mask`` and ``allowed_prefix`` leave its state as it was;
    ``accept`` advances it."""

    def __init__(self, output_format: OutputFormat, tokenizer, eos_ids: Iterable[int]) -> None:
        self.output_format, self.tokenizer, self.eos_ids = output_format, tokenizer, tuple(eos_ids)
        self._matcher = None
        self._bits = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8)

    def _parser(self, n_vocab: int):
        if self._matcher is None:  # built at the first logits: the mask covers their width
            import llguidance

            tokenizer = _llg_tokenizer(self.tokenizer, n_vocab, self.eos_ids)
            self._matcher = llguidance.LLMatcher(tokenizer, grammar_for(self.output_format), log_level=0)
            self._check()
        return self._matcher

    def _check(self) -> None:
        if self._matcher.is_error():
            raise InvalidRequest(f"the output format cannot be followed: {self._matcher.get_error()}")

    def _allowed(self, n_vocab: int) -> torch.Tensor:
        packed = torch.frombuffer(bytearray(self._matcher.compute_bitmask()), dtype=torch.uint8)
        self._check()
        allowed = (packed.unsqueeze(1) & self._bits).ne(0).flatten()[:n_vocab]
        if not allowed.any():
            raise InvalidRequest("the output format allows no next token: the schema cannot be completed")
        return allowed

    def mask(self, logits: torch.Tensor, draft: Sequence[int] = ()) -> torch.Tensor:
        """``logits`` [rows, V] (rows <= len(draft) + 1), row i masked by the state after
        ``draft[:i]``; rows after a draft token the grammar forbids, or after its end, are left
        as they are (verification never reads past that token). Returns the masked copy."""
        rows, n_vocab = logits.shape
        matcher = self._parser(n_vocab)
        masked = logits.clone()
        consumed = 0
        try:
            for i in range(rows):
                masked[i].masked_fill_(~self._allowed(n_vocab).to(logits.device), float("-inf"))
                if i == rows - 1 or i >= len(draft) or matcher.is_stopped():
                    break
                if not matcher.try_consume_tokens([draft[i]]):
                    break
                consumed += 1
        finally:
            if consumed:
                matcher.rollback(consumed)
        return masked

    def allowed_prefix(self, draft: Sequence[int]) -> int:
        """How many of ``draft``'s first tokens the grammar allows, in order (after the first
        ``mask``, which builds the parser)."""
        if self._matcher is None or not draft:
            return len(draft)
        return self._matcher.validate_tokens(list(draft))

    def accept(self, tokens: Sequence[int]) -> None:
        """Advance past committed tokens (each one a masked row allowed), up to the grammar's
        end: a verified block may go on past the end-of-text token, and the output stops there."""
        if self._matcher is None:
            return
        for token in tokens:
            if self._matcher.is_stopped():
                return
            self._matcher.consume_token(token)
            self._check()

    @property
    def finished(self) -> bool:
        """The output is complete: the grammar took its end (an end-of-text token)."""
        return self._matcher is not None and self._matcher.is_stopped()
