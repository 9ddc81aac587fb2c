"""Events a Hub download yields. Frozen, typed, safe to pass across threads (the Qt worker emits
each one as a ``Signal(object)``).

A download yields exactly one ``DownloadStarted`` (unless it fails before), any number of
``DownloadProgress`` (at most a few per second) and ``DownloadNotice`` (something went wrong
and was repaired: worth telling the user), and ends with ``DownloadFinished`` or
``DownloadFailed``.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

# Why a download failed, so the UI can offer the right next step (retry, log in, free space...).
FailureKind = Literal[
    "offline",    # HF_HUB_OFFLINE is set or the Hub cannot be reached, and the model is not installed
    "not_found",  # no such repo / revision / file, or no usable weights in it
    "gated",      # the repo needs an accepted licence and a logged-in token
    "disk_full",  # not enough free space (checked before starting) or the disk filled up
    "corrupt",    # bytes on disk do not match the size or hash the Hub published
    "cancelled",  # the caller set the cancel event
    "mismatch",   # the drafter's tokenizer differs from the target's (and cross_tokenizer is off)
    "network",    # the connection broke or timed out and retries did not help
    "unsafe",     # the Hub's answer is refused: a name (commit, file, hash) that is not of the Hub's form or
                  # would leave the cache, a listing past its bounds; or the revision asked for is not valid
]


@dataclass(frozen=True)
class DownloadStarted:
    """``files`` are ``"repo/path"`` labels of everything the plan covers, ``total_bytes`` their
    sum; ``bytes_present`` is what was already on disk (cached or a partial file to resume)."""

    files: tuple[str, ...]
    total_bytes: int
    bytes_present: int
    target_repo: str
    drafter_repo: str | None


@dataclass(frozen=True)
class DownloadProgress:
    """Across all files of target and drafter. ``rate_bps`` counts only bytes received in this
    run (recent window); ``eta_s`` is None until a rate is known."""

    bytes_done: int
    bytes_total: int
    rate_bps: float
    eta_s: float | None
    current_file: str


@dataclass(frozen=True)
class DownloadNotice:
    """A problem the download repaired by itself, e.g. a file whose bytes did not match the
    Hub's sha256 was deleted and is fetched again."""

    message: str


@dataclass(frozen=True)
class DownloadFinished:
    """Both models are complete and verified. The paths are what ``Session.load`` takes: model
    folders, or for a GGUF variant its .gguf file (the first part of a split one).
    ``same_tokenizer`` is False only for a drafter fetched with ``cross_tokenizer=True`` whose
    vocabulary differs; None when there is no separate drafter to compare, or for GGUF files
    (whose tokenizers the load compares: a mismatched drafter is refused there)."""

    target_path: Path
    drafter_path: Path | None
    drafter_kind: str | None
    same_tokenizer: bool | None
    bytes_downloaded: int
    seconds: float


@dataclass(frozen=True)
class DownloadFailed:
    error: str
    kind: FailureKind


DownloadEvent = DownloadStarted | DownloadProgress | DownloadNotice | DownloadFinished | DownloadFailed
