"""Fetching one file of a Hub repo into huggingface_hub's cache: resumable, verified, stoppable.

Why not ``hf_hub_download``: as of huggingface_hub 2.4 it downloads into a process-unique
temporary file that it deletes on any failure, so an interrupted download starts over; it has
no cancel hook; and its per-byte progress goes through tqdm in 10 MB chunks. Here we use its
building blocks instead (``get_hf_file_metadata`` for the HEAD request and its errors,
``get_session`` for the HTTP client with its offline hook, ``build_hf_headers`` for the token)
and stream ourselves into ``blobs/<etag>.incomplete``, which survives a crash or a cancel and is
continued with an HTTP Range request. The bytes are hashed as they arrive and compared with the
sha256 (LFS files) or git blob id (regular files) that the Hub publishes; only a file that
matches is renamed to its final blob name, so nothing half-written is ever visible as a file.
A body that does not match is deleted and fetched once more from its first byte (a copy spoiled
on the way is then repaired in the same run); a second mismatch fails the file.

The server is not trusted further than the hashes: an ETag must be a hash before it names a
blob (``engine.hub.safe_names``), a body is never written past the size the listing declared
(a longer one is refused and its partial file deleted), a resume must continue at the byte
asked for, and a server that stops sending times out and is resumed.

Runs on a worker thread; ``stop`` is checked between chunks (the generator that drives the
worker does not wait for it: see engine.hub.download).
"""
from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path
from urllib.parse import urljoin, urlsplit

from engine.hub.cache import (
    blob_path,
    blob_verified,
    link_pointer,
    lock_path,
    mark_blob_verified,
    partial_path,
    pointer_path,
)
from engine.hub.files import HubFile
from engine.hub.responses import (
    BodyTooLong,
    IntegrityError,
    check_announced_length,
    check_resumed_range,
)
from engine.hub.safe_names import blob_hash

log = logging.getLogger(__name__)
HASH_BLOCK = 4 << 20
METADATA_TIMEOUT_S = 10.0  # HEAD / model info: fail fast when the Hub is unreachable
READ_TIMEOUT_S = 20.0      # a stalled body read counts as a network error and is retried
RETRIES = 3                # per file, each resuming from the bytes already on disk
REFETCHES = 1              # per file: a body whose hash is wrong is fetched again from scratch this often


class Stopped(Exception):
    """The caller asked to stop; the partial file is kept for a later resume."""


class TransferFailed(Exception):
    """The connection kept failing or stalling for one file; its partial file is kept."""


def http_library():
    """The HTTP client library huggingface_hub uses (httpx2 in 2.x, httpx in 1.x)."""
    try:
        import httpx2 as http
    except ImportError:  # pragma: no cover - depends on the installed huggingface_hub
        import httpx as http
    return http


def transport_errors() -> tuple[type[BaseException], ...]:
    """The HTTP client's connection-level errors (huggingface_hub 2.x uses httpx2, 1.x httpx)."""
    return (http_library().TransportError,)


@dataclass
class Progress:
    """Shared between the worker (sole writer) and the generator (reader). ``done`` counts bytes
    on disk for the plan's files, ``received`` only bytes that came over the network this run."""

    done: int = 0
    received: int = 0
    current: str = ""
    notices: list[str] = field(default_factory=list)  # things the user should hear of, in order (append only)


@dataclass
class _FileCount:
    """How much of one file is counted in ``Progress.done``, kept in step with the disk."""

    progress: Progress
    level: int = 0

    def set(self, n: int) -> None:
        self.progress.done += n - self.level
        self.level = n

    def add(self, n: int) -> None:
        self.level += n
        self.progress.done += n
        self.progress.received += n


@dataclass
class _Digest:
    hasher: object | None
    length: int = 0

    def update(self, chunk: bytes) -> None:
        if self.hasher is not None:
            self.hasher.update(chunk)
        self.length += len(chunk)


@dataclass
class Transfer:
    endpoint: str
    cache: Path
    token: str | bool | None
    stop: threading.Event
    progress: Progress = field(default_factory=Progress)
    retries: int = field(default_factory=lambda: RETRIES)  # read when made, so a test may lower it
    refetches: int = field(default_factory=lambda: REFETCHES)

    def notify(self, message: str) -> None:
        """Log ``message`` and pass it on to whoever watches the download (DownloadNotice)."""
        log.warning("%s", message)
        self.progress.notices.append(message)


def expected_digest(f: HubFile) -> str | None:
    return f.sha256 or f.git_sha1


def _new_digest(f: HubFile) -> _Digest:
    if f.sha256:
        return _Digest(hashlib.sha256())
    if f.git_sha1:
        h = hashlib.sha1()
        h.update(f"blob {f.size}\0".encode())  # git hashes a header, then the content
        return _Digest(h)
    return _Digest(None)


def _hash_into(digest: _Digest, path: Path, stop: threading.Event) -> None:
    with open(path, "rb") as fh:
        while block := fh.read(HASH_BLOCK):
            if stop.is_set():
                raise Stopped()
            digest.update(block)


def _matches(digest: _Digest, f: HubFile) -> bool:
    if digest.length != f.size:
        return False
    want = expected_digest(f)
    return want is None or digest.hasher.hexdigest() == want


def present_bytes(cache: Path, repo: str, f: HubFile) -> int:
    """Bytes of ``f`` already on disk (a complete blob or a partial one), by the etag the
    listing implies; used for the free-space check and the starting point of progress."""
    if not f.etag:
        return 0
    if blob_path(cache, repo, f.etag).exists():
        return f.size
    partial = partial_path(cache, repo, f.etag)
    return min(partial.stat().st_size, f.size) if partial.exists() else 0


@contextmanager
def _locked(path: Path, stop: threading.Event) -> Iterator[None]:
    from filelock import FileLock, Timeout

    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    while True:
        try:
            lock.acquire(timeout=0.2)
            break
        except Timeout:
            if stop.is_set():
                raise Stopped() from None
    try:
        yield
    finally:
        lock.release()


def _with_hash_from_etag(f: HubFile, etag: str) -> HubFile:
    """A listing without blob metadata (some mirrors) still gets a hash check from the ETag:
    64 hex digits are an LFS sha256, 40 a git blob id."""
    if expected_digest(f) is not None:
        return f
    if len(etag) == 64:
        return replace(f, sha256=etag)
    if len(etag) == 40:
        return replace(f, git_sha1=etag)
    log.warning("%s: no hash published; checking its size only", f.path)
    return f


def ensure_file(t: Transfer, repo: str, commit: str, f: HubFile) -> Path:
    """Make ``snapshots/<commit>/<f.path>`` a verified copy of ``f``; returns that path.

    A blob already in the cache (from an earlier run or another tool) is verified and reused;
    a partial one is continued; a wrong one is deleted and fetched again."""
    pointer = pointer_path(t.cache, repo, commit, f.path)
    count = _FileCount(t.progress, present_bytes(t.cache, repo, f))
    t.progress.current = f"{repo}/{f.path}"
    if f.etag and blob_path(t.cache, repo, f.etag).exists():
        blob = blob_path(t.cache, repo, f.etag)
        with _locked(lock_path(t.cache, repo, f.etag), t.stop):
            if not blob_verified(t.cache, repo, f.etag):
                digest = _new_digest(f)
                _hash_into(digest, blob, t.stop)
                if _matches(digest, f):
                    mark_blob_verified(t.cache, repo, f.etag)
            if blob_verified(t.cache, repo, f.etag):
                link_pointer(blob, pointer)
                count.set(f.size)
                return pointer
            t.notify(f"{repo}/{f.path}: the copy on disk does not match the {_hash_name(f)} the Hub published;"
                     " deleted it and fetching the file again")
            blob.unlink()
            count.set(0)
    return _download(t, repo, commit, f, pointer, count)


def _download(t: Transfer, repo: str, commit: str, f: HubFile, pointer: Path, count: _FileCount) -> Path:
    from huggingface_hub import get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import build_hf_headers

    url = hf_hub_url(repo, f.path, revision=commit, endpoint=t.endpoint)
    meta = get_hf_file_metadata(url, token=t.token, timeout=METADATA_TIMEOUT_S, endpoint=t.endpoint)
    etag = meta.etag or f.etag
    if not etag:
        raise IntegrityError(f"{repo}/{f.path}: the Hub sent no ETag for it")
    etag = blob_hash(etag, repo, f.path, "ETag")  # it names the blob: a hash, never a path
    if meta.size is not None and meta.size != f.size:
        raise IntegrityError(f"{repo}/{f.path}: the Hub reports {meta.size:,} bytes but listed {f.size:,}")
    if f.etag and etag != f.etag:
        log.info("%s/%s: ETag %s differs from the listing's %s; naming the blob by the ETag", repo, f.path, etag, f.etag)
        count.set(0)
    f = _with_hash_from_etag(f, etag)
    location = urljoin(url, meta.location)
    headers = build_hf_headers(token=t.token)
    headers["Accept-Encoding"] = "identity"  # hash and resume the bytes as stored, not a gzip of them
    if urlsplit(location).netloc != urlsplit(url).netloc:
        headers.pop("authorization", None)  # a CDN link is signed; the token stays on the Hub
    blob, partial = blob_path(t.cache, repo, etag), partial_path(t.cache, repo, etag)
    with _locked(lock_path(t.cache, repo, etag), t.stop):
        if not blob.exists():  # another process may have finished it while we waited
            blob.parent.mkdir(parents=True, exist_ok=True)
            _fetch_verified(t, location, headers, partial, f, count, f"{repo}/{f.path}")
            os.replace(partial, blob)
            mark_blob_verified(t.cache, repo, etag)
        elif not blob_verified(t.cache, repo, etag):
            digest = _new_digest(f)
            _hash_into(digest, blob, t.stop)
            if not _matches(digest, f):
                raise IntegrityError(f"{repo}/{f.path}: the cached copy does not match its hash; delete {blob} and retry")
            mark_blob_verified(t.cache, repo, etag)
        link_pointer(blob, pointer)
    count.set(f.size)
    return pointer


def _hash_name(f: HubFile) -> str:
    return "sha256" if f.sha256 else "git blob id" if f.git_sha1 else "size"


def _fetch_verified(t: Transfer, url: str, headers: dict, partial: Path, f: HubFile, count: _FileCount,
                    label: str) -> None:
    """Stream ``f`` into ``partial`` until its bytes match the published size and hash; a
    mismatching copy is deleted (never renamed to its blob name) and fetched again from byte 0,
    ``t.refetches`` times, then the file fails."""
    for attempt in range(t.refetches + 1):
        digest = _stream_with_retries(t, url, headers, partial, f, count, label)
        if _matches(digest, f):
            return
        partial.unlink(missing_ok=True)
        count.set(0)
        got = digest.hasher.hexdigest()[:12] if digest.hasher else "?"
        what = (f"got {digest.length:,} bytes with {_hash_name(f)} {got}…, the Hub published {f.size:,} bytes"
                f" with {_hash_name(f)} {(expected_digest(f) or '?')[:12]}…")
        if attempt < t.refetches:
            t.notify(f"{label}: the downloaded copy is corrupted ({what}); deleted it and fetching the file again")
            continue
        raise IntegrityError(
            f"{label} is corrupted: {what} (fetched {'once' if attempt == 0 else f'{attempt + 1} times'})."
            " The bad copy was deleted; downloading again fetches it afresh.")


def _stream_with_retries(t: Transfer, url: str, headers: dict, partial: Path, f: HubFile, count: _FileCount,
                         label: str) -> _Digest:
    digest: _Digest | None = None
    failures = 0
    while True:
        on_disk = partial.stat().st_size if partial.exists() else 0
        if on_disk > f.size:  # not a prefix of this file: start over
            partial.unlink()
            on_disk = 0
        if digest is None or digest.length != on_disk:
            digest = _new_digest(f)
            if on_disk:
                _hash_into(digest, partial, t.stop)
        count.set(on_disk)
        if on_disk == f.size:
            return digest
        before = digest.length
        try:
            _get(t, url, headers, partial, f, digest, count, label)
            return digest
        except Exception as exc:
            if not _retryable(exc):
                raise
            # Count only failures in a row: a long download over a flaky link may drop many
            # times, and each resume that got data further is progress.
            failures = 1 if digest.length > before else failures + 1
            if failures > t.retries:
                if isinstance(exc, transport_errors()):
                    raise TransferFailed(_gave_up(exc, label, failures, partial, f)) from exc
                raise
            wait = min(4.0, 0.5 * 2 ** (failures - 1))
            log.warning("%s: %s; resuming in %.1fs (attempt %d of %d)", f.path, exc, wait, failures + 1, t.retries + 1)
            if t.stop.wait(wait):
                raise Stopped() from None


def _gave_up(exc: Exception, label: str, failures: int, partial: Path, f: HubFile) -> str:
    kept = partial.stat().st_size if partial.exists() else 0
    if isinstance(exc, http_library().TimeoutException):
        why = f"the server stopped sending (no data for {READ_TIMEOUT_S:g} s"
    else:
        why = f"the connection failed ({type(exc).__name__}: {exc}"
    return (f"{label}: {why}, {failures} times in a row). {kept:,} of {f.size:,} bytes are kept;"
            " run the download again to resume from there.")


def _retryable(exc: Exception) -> bool:
    """Connection drops, timeouts, and the HTTP statuses that mean "try again shortly"."""
    from huggingface_hub.errors import HfHubHTTPError

    if isinstance(exc, transport_errors()):
        return True
    status = exc.response.status_code if isinstance(exc, HfHubHTTPError) and exc.response is not None else None
    return status in (408, 429, 500, 502, 503, 504)


def _get(t: Transfer, url: str, headers: dict, partial: Path, f: HubFile, digest: _Digest, count: _FileCount,
         label: str) -> None:
    from huggingface_hub.utils import get_session, hf_raise_for_status

    resume = digest.length
    request_headers = dict(headers)
    if resume:
        request_headers["Range"] = f"bytes={resume}-"
    with get_session().stream("GET", url, headers=request_headers, timeout=READ_TIMEOUT_S, follow_redirects=True) as response:
        if response.status_code == 416:  # our partial is not a prefix the server knows: start over
            partial.unlink(missing_ok=True)
            raise IntegrityError(f"{f.path}: the server refused to resume it; downloading again starts afresh")
        hf_raise_for_status(response)
        mode = "ab"
        if resume and response.status_code != 206:  # Range ignored: the body is the whole file
            log.info("%s: server ignored the Range request; starting over", f.path)
            digest.hasher, digest.length = _new_digest(f).hasher, 0
            count.set(0)
            mode = "wb"
        elif resume:
            check_resumed_range(response.headers.get("Content-Range"), resume, f, label)
        try:
            room = f.size - digest.length  # what the file still lacks: never write past it
            check_announced_length(response.headers, room, f, label)
            with open(partial, mode) as out:
                for chunk in response.iter_bytes():
                    if t.stop.is_set():
                        raise Stopped()
                    if len(chunk) > room:
                        raise BodyTooLong(
                            f"{label}: the server sent a body longer than the file's declared size of {f.size:,} bytes;"
                            " stopped there and deleted the partial copy. Downloading again fetches it afresh.")
                    out.write(chunk)
                    room -= len(chunk)
                    digest.update(chunk)
                    count.add(len(chunk))
        except BodyTooLong:
            partial.unlink(missing_ok=True)
            count.set(0)
            raise

