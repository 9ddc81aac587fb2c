"""The prompt sets a bench reads (resources/prompts/*.jsonl, or a person's own file): one JSON
object a line with an id, a category and the prompt (text, or chat messages), checked line by
line so that a bad file names its line and what is wrong with it."""
from __future__ import annotations

import json
from pathlib import Path

from engine.core.settings import InvalidRequest, check_prompt


class PromptFileError(InvalidRequest):
    """A bench prompt file that cannot be used; the message names the file and line."""


def read_prompts(path: Path) -> list[dict]:
    """Every prompt of a JSONL file (one object a line with "id", "category" and "prompt"
    strings, ids unique), checked whole before any model is loaded: the first bad line is
    refused with its file and line number."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise PromptFileError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from None
    prompts, seen = [], {}
    for n, line in enumerate(raw.splitlines(), 1):
        where = f"{path}:{n}"
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PromptFileError(f"{where}: not valid UTF-8 (byte 0x{line[exc.start]:02x} at column {exc.start + 1})") from None
        if not text.strip():
            continue
        try:
            item = json.loads(text)
        except ValueError as exc:
            raise PromptFileError(f"{where}: not a JSON object ({exc})") from None
        if not isinstance(item, dict):
            raise PromptFileError(f"{where}: each line must be a JSON object with id, category and prompt, not {type(item).__name__}")
        missing = [k for k in ("id", "category", "prompt") if k not in item]
        if missing:
            raise PromptFileError(f"{where}: missing {', '.join(missing)}")
        for key in ("id", "category", "prompt"):
            if not isinstance(item[key], str):
                raise PromptFileError(f"{where}: {key} must be a string, not {type(item[key]).__name__}")
        if not item["id"].strip() or not item["category"].strip():
            raise PromptFileError(f"{where}: id and category must not be empty")
        try:
            check_prompt(item["prompt"], f"the prompt of {item['id']!r}")
            check_prompt(item["id"], "the id")
        except InvalidRequest as exc:
            raise PromptFileError(f"{where}: {exc}") from None
        if item["id"] in seen:
            raise PromptFileError(f"{where}: the id {item['id']!r} is already used on line {seen[item['id']]}")
        seen[item["id"]] = n
        prompts.append(item)
    if not prompts:
        raise PromptFileError(f"{path} holds no prompts")
    return prompts


def select_prompts(prompts: list[dict], categories: list[str] | None = None, limit: int = 0) -> list[dict]:
    """The prompts of ``categories`` (all when None), the first ``limit`` of them (0: all).
    An unknown category is refused with the ones that exist."""
    if limit < 0:
        raise InvalidRequest(f"limit must be >= 0 (0: every prompt), not {limit}")
    if categories:
        known = sorted({p["category"] for p in prompts})
        unknown = [c for c in categories if c not in known]
        if unknown:
            raise InvalidRequest(f"no prompts of category {', '.join(map(repr, unknown))}; the prompt file has"
                                 f" {', '.join(known)}")
        prompts = [p for p in prompts if p["category"] in categories]
    return prompts[:limit] if limit else prompts
