"""The library's records: what a model file is, where it came from, and what drafts for it.

All frozen dataclasses, for the CLI and the picker to show as they are. Sizes are bytes,
counts are plain ints; a field a damaged or foreign file cannot supply is None, and then
``problem`` says why Tandem cannot run it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Literal

#: Where a model was found: LM Studio's models folder, Ollama's store, llama.cpp's download
#: cache, or a file registered with ``tandem import``.
Source = Literal["lmstudio", "ollama", "llama.cpp", "imported"]
#: Drafter candidates can also be Tandem's own models (converted folders, the default pair's GGUF files).
CandidateSource = Literal["lmstudio", "ollama", "llama.cpp", "imported", "tandem"]
RefusalReason = Literal["vocabulary", "larger", "architecture"]


@dataclass(frozen=True)
class Summary:
    """What a model's header says. ``quant``: how the file holds its weights ("Q4_K_M", or
    "mostly Q5_0" where the file-type metadata is not borne out); ``quant_types``: tensors
    per type, commonest first; ``vocab_fingerprint``: engine.library.vocab.fingerprint of its
    token list; ``problem``: why Tandem cannot run it (None when it can)."""

    architecture: str | None
    title: str | None  # general.name, as the publisher wrote it
    quant: str | None
    quant_types: tuple[tuple[str, int], ...]
    parameter_count: int | None
    context_length: int | None
    vocab_size: int | None
    vocab_fingerprint: str | None
    problem: str | None = None

    def to_json(self) -> dict:
        return {**asdict(self), "quant_types": [list(t) for t in self.quant_types]}

    @classmethod
    def from_json(cls, data: dict) -> Summary:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["quant_types"] = tuple((str(t), int(n)) for t, n in values.get("quant_types") or ())
        return cls(**values)


@dataclass(frozen=True)
class DrafterCandidate:
    """An installed model that could draft: a GGUF file (``kind`` "gguf") or a model folder
    Tandem converted (``kind`` "folder", under Tandem's cache dir)."""

    name: str
    path: Path
    source: CandidateSource
    kind: Literal["gguf", "folder"]
    file_bytes: int
    architecture: str | None
    parameter_count: int | None
    vocab_fingerprint: str | None
    problem: str | None = None  # why Tandem cannot run it (None when it can)

    @property
    def runnable(self) -> bool:
        return self.problem is None


@dataclass(frozen=True)
class DrafterRefusal:
    """A candidate turned down, and why: another vocabulary (``token_id``: the first id whose
    string differs), not smaller than the target, or an architecture Tandem cannot run."""

    candidate: DrafterCandidate
    why: RefusalReason
    message: str
    token_id: int | None = None


@dataclass(frozen=True)
class Drafting:
    """How a model will be drafted for: by ``drafter`` (``kind`` "model"), or by prompt lookup
    (``kind`` "lookup", ``drafter`` None) with ``reason`` saying why no model drafts.
    ``refusals``: every other candidate considered, with its reason, for the picker to list."""

    kind: Literal["model", "lookup"]
    drafter: DrafterCandidate | None
    reason: str
    refusals: tuple[DrafterRefusal, ...] = ()


@dataclass(frozen=True)
class LocalModel:
    """A GGUF model found on this machine. ``path``: its file (the first part of a split
    model; an Ollama blob has no .gguf name: give ``engine.library.loadable_path(model)`` to
    Session.load); ``parts``: every file it spans; ``file_bytes``: their total size;
    ``drafting``: None for a model Tandem cannot run (see ``problem``)."""

    name: str
    path: Path
    parts: tuple[Path, ...]
    source: Source
    file_bytes: int
    summary: Summary
    drafting: Drafting | None = None

    @property
    def architecture(self) -> str | None:
        return self.summary.architecture

    @property
    def quant(self) -> str | None:
        return self.summary.quant

    @property
    def parameter_count(self) -> int | None:
        return self.summary.parameter_count

    @property
    def context_length(self) -> int | None:
        return self.summary.context_length

    @property
    def vocab_fingerprint(self) -> str | None:
        return self.summary.vocab_fingerprint

    @property
    def problem(self) -> str | None:
        return self.summary.problem

    @property
    def runnable(self) -> bool:
        return self.summary.problem is None

    def as_candidate(self) -> DrafterCandidate:
        return DrafterCandidate(self.name, self.path, self.source, "gguf", self.file_bytes, self.architecture,
                                self.parameter_count, self.vocab_fingerprint, self.problem)

    def to_dict(self) -> dict:
        """JSON-ready (for ``tandem models --json`` rows)."""
        drafting = None
        if self.drafting is not None:
            drafting = {"kind": self.drafting.kind, "reason": self.drafting.reason,
                        "drafter": None if self.drafting.drafter is None else
                        {"name": self.drafting.drafter.name, "path": str(self.drafting.drafter.path),
                         "source": self.drafting.drafter.source}}
        return {"name": self.name, "path": str(self.path), "parts": [str(p) for p in self.parts], "source": self.source,
                "file_bytes": self.file_bytes, **self.summary.to_json(), "drafting": drafting}
