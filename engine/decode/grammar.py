"""Output held to a JSON schema (OpenAI's ``response_format``), speculation still lossless.

The grammar engine is llguidance: it compiles a JSON schema into a token-level parser and
computes the set of tokens allowed next in ~0.1 ms over a 152k-token vocabulary, with limits
on what a hostile schema may cost, and no dependencies (xgrammar needs triton; outlines-core
builds a regex index over the vocabulary per schema, seconds for one of any size).

Where the constraint acts, and why there only:

    the target     every row of logits the decode loop chooses or verifies from is masked by
                   the parser's state after the tokens before that row (``mask``): the output
                   is a draw from the constrained target distribution, plain or speculative
    the drafter    a draft model drafts under the grammar too (``draft_mask``): each draft
                   token is chosen from the drafter's logits masked by the state after the
                   drafts before it, so no draft position is spent on a token the grammar
                   forbids. Speculative sampling is lossless for any draft distribution; the
                   masked one is the q the draft was drawn from and verification reads. Other
                   drafters draft as they are: a forbidden token is rejected (its masked target
                   probability is 0), and greedy drafts are cut at the first one
                   (``allowed_prefix``), which shortens the verification pass. (Sampled drafts
                   are not cut: that would draw the next token from the target instead of the
                   residual and bias the output.)

The parser's state advances only with tokens the decode loop commits (``accept``).

Where the grammar allows a single token next (a key's closing quote and colon, a bracket), that
token is the constrained target's choice whatever its logits: the loops commit such tokens
(``forced``) without a pass or a draft, and feed them to the target with the next pass. The
tokenization is the one the target would have chosen, since no other was allowed; llguidance's
own fast-forward, which writes forced text in its canonical tokens, would not be lossless.
"""
from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Sequence

import numpy as np
import torch

from engine.core.settings import JSON_WHITESPACE, InvalidRequest, OutputFormat

# A schema is a request field: bounded like the rest of the body, far above real ones.
MAX_SCHEMA_CHARS = 256 * 1024

#: Commit the tokens the grammar allows alone without a pass (``forced``); off only to measure
#: what that saves (scripts/structured_bench.py).
COMMIT_FORCED = True

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
        self._width = 0  # the target's logits' width the masks cover
        self._drafted = 0  # draft tokens consumed on top of the committed state
        self._bits = torch.tensor([1 << i for i in range(8)], dtype=torch.uint8)

    def _parser(self, n_vocab: int):
        if self._matcher is None:  # built at the first logits: the mask covers their width
            import llguidance

            tokenizer = _llg_tokenizer(self.tokenizer, n_vocab, self.eos_ids)
            self._matcher = llguidance.LLMatcher(tokenizer, grammar_for(self.output_format), log_level=0)
            self._width = n_vocab
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

    def forced(self, limit: int) -> list[int]:
        """The tokens the grammar allows alone from here, in order (at most ``limit``): each one
        the only token its masked row could give, so the constrained target's choice whatever
        its logits (greedy, and sampled with probability 1). The state is left as it was."""
        if self._matcher is None or limit <= 0:
            return []
        tokens: list[int] = []
        try:
            while len(tokens) < limit and not self._matcher.is_stopped():
                token = self._single_allowed()
                if token is None or not self._matcher.try_consume_tokens([token]):
                    break
                tokens.append(token)
        finally:
            if tokens:
                self._matcher.rollback(len(tokens))
        return tokens

    def _single_allowed(self) -> int | None:
        """The one token allowed next, or None when there are more (or none)."""
        packed = np.frombuffer(bytes(self._matcher.compute_bitmask()), dtype=np.uint8)
        self._check()
        lit = np.flatnonzero(packed)
        if len(lit) != 1 or packed[lit[0]] & (packed[lit[0]] - 1):  # more than one bit set
            return None
        return int(lit[0]) * 8 + int(packed[lit[0]]).bit_length() - 1

    # -- a drafter drafting under the grammar: each draft token masked by the state after the
    # ones before it; the state goes back to the committed one when the draft is done.
    def draft_mask(self, width: int) -> torch.Tensor | None:
        """The tokens allowed after the draft so far, as a bool mask [width] (None before the
        first ``mask`` has built the parser, or once the grammar is complete)."""
        if self._matcher is None or self._matcher.is_stopped():
            return None
        allowed = self._allowed(self._width)
        if width <= self._width:
            return allowed[:width]
        return torch.cat([allowed, allowed.new_zeros(width - self._width)])  # past the target's vocabulary

    def draft_token(self, token: int) -> bool:
        """Advance past a drafted token (False: the grammar does not allow it)."""
        if self._matcher is None or not self._matcher.try_consume_tokens([token]):
            return False
        self._drafted += 1
        return True

    def end_draft(self) -> None:
        """Back to the committed state."""
        if self._drafted:
            self._matcher.rollback(self._drafted)
            self._drafted = 0

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
