"""The person's saved conversations as prompts the target answers for a drafter's data: opt-in
(`tandem distill --conversations`, the app's "also learn from my conversations"), and nothing
leaves the machine.

Each message the person sent, with the conversation before it, is a prompt: the target writes
its own reply to it, so the drafter learns the replies of this person's own use (their language,
their code, their files) beside the shipped prompts'. Newest conversations first, and their turns
taken in rounds (the newest turn of each, then the one before it, ...), so a limit spreads over
many conversations rather than spending itself on the first long one. A prompt over the token
limit loses its oldest turns (a system prompt stays); one whose last turn alone is over it is
skipped.

The files are the app's conversation store (one JSON file a conversation: "messages" with each
turn's "role", "content" and attached files, "system_prompt", "updated"); the app hands over the
conversations it has loaded and validated instead. Read here as the app reads them, since a folder
can hold anything: through the store's own walk (engine.session.conversation_files: regular
files named by a conversation id, bounded before parsing, checked against the store's schema); a
file the app would set aside is skipped here and counted, never fatal.
"""
from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from engine.session.conversation_files import read_conversation_files
from engine.session.saved_turns import model_turn

#: Messages of saved chats answered at most, and a prompt's length at most (`tandem distill`'s
#: and the app's defaults).
CONVERSATION_TURNS = 64
PROMPT_TOKENS = 2048


@dataclass(frozen=True)
class SavedConversations:
    """What a folder held: each conversation's messages as the model reads them, newest first."""

    conversations: tuple[list[dict], ...]
    #: Files that were not conversations (unreadable, too large, not the store's form).
    skipped: int = 0


def read_folder(folder: Path) -> SavedConversations:
    """The conversations saved in ``folder`` (the app's store), newest first."""
    found: list[tuple[float, list[dict]]] = []
    skipped = 0
    for saved in read_conversation_files(folder):  # the store's own walk: the same files refused
        if saved.raw is None:
            skipped += 1
        else:
            found.append((saved.raw["updated"], model_messages(saved.raw)))
    found.sort(key=lambda item: item[0], reverse=True)
    return SavedConversations(tuple(messages for _, messages in found), skipped)


def model_messages(raw: dict) -> list[dict]:
    """A saved conversation, valid by the store's schema, as the chat template's messages."""
    system = raw.get("system_prompt", "")
    return ([{"role": "system", "content": system}] if system.strip() else []) + [model_turn(m) for m in raw["messages"]]


def turn_prompts(conversations: Iterable[list[dict]], limit: int) -> list[list[dict]]:
    """Up to ``limit`` prompts (0: all): each message the person sent (or a tool's result the
    model went on from) with what came before it; from the conversations in the order given, in
    rounds of the newest turn not yet taken of each."""
    per_conversation = []
    for messages in conversations:
        ends = [i for i, m in enumerate(messages) if m["role"] in ("user", "tool")
                and (i + 1 == len(messages) or messages[i + 1]["role"] == "assistant")]
        per_conversation.append([messages[: i + 1] for i in reversed(ends)])
    prompts: list[list[dict]] = []
    for round_ in range(max((len(p) for p in per_conversation), default=0)):
        for turns in per_conversation:
            if round_ < len(turns):
                prompts.append(turns[round_])
                if limit and len(prompts) == limit:
                    return prompts
    return prompts


def encode_within(encode: Callable[[list[dict]], list[int]], messages: list[dict], max_tokens: int) -> list[int] | None:
    """The prompt's ids through ``encode`` (the chat template), its oldest turns dropped until it
    is at most ``max_tokens`` (a system prompt stays, and so does the last turn); None when the
    last turn alone is over, or the template refuses it."""
    system = messages[:1] if messages and messages[0]["role"] == "system" else []
    turns = messages[len(system):]
    from jinja2.exceptions import TemplateError

    while turns:
        try:
            ids = encode(system + turns)
        except (ValueError, TypeError, KeyError, TemplateError):  # the template's refusal (an odd saved turn)
            return None
        if len(ids) <= max_tokens:
            return ids
        turns = turns[1:]
        while turns and turns[0]["role"] != "user":  # start on a turn the person sent
            turns = turns[1:]
    return None


def conversation_prompts(conversations: Iterable[list[dict]], encode: Callable[[list[dict]], list[int]],
                         limit: int, max_tokens: int) -> tuple[list[list[int]], int]:
    """(the encoded prompts, how many were left out: too long, or refused by the template) of
    ``turn_prompts``."""
    out, skipped = [], 0
    for prompt in turn_prompts(conversations, 0):
        ids = encode_within(encode, prompt, max_tokens)
        if ids is None:
            skipped += 1
            continue
        out.append(ids)
        if limit and len(out) == limit:
            break
    return out, skipped


def prompt_limit(model_config, wanted: int, reply_tokens: int) -> int:
    """Tokens a saved chat's prompt may have: ``wanted``, and room left for the reply in the
    model's context window (where its config says)."""
    window = getattr(model_config.get_text_config(), "max_position_embeddings", None)
    return min(wanted, window - reply_tokens) if window else wanted


def interleave(first: list, second: list) -> list:
    """The two lists' items taken in turn (what is left of the longer one after), so a data time
    limit leaves some of each."""
    out = []
    for i in range(max(len(first), len(second))):
        out += first[i : i + 1] + second[i : i + 1]
    return out
