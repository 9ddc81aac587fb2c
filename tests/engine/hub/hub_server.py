"""A small Hugging Face Hub on 127.0.0.1, for download tests without the internet.

It implements what huggingface_hub (2.4) calls when it lists and downloads a model repo:

* ``GET /api/models/{repo}[/revision/{rev}]?blobs=true`` -- model info: ``sha`` (the commit),
  ``gated``, and ``siblings`` with ``size``, ``blobId`` and, for LFS files, ``lfs.sha256``.
* ``HEAD|GET /{repo}/resolve/{rev}/{path}`` -- regular files are answered directly with
  ``ETag`` (git blob id), ``X-Repo-Commit`` and ``Content-Length``; LFS files with a 302 to the
  "CDN" (a second listener on another port, so the client sees another origin, as with the
  real Hub's CDN) carrying ``X-Linked-Etag`` (sha256), ``X-Linked-Size`` and ``Location``.
  Errors carry ``X-Error-Code`` (RepoNotFound, RevisionNotFound, EntryNotFound, GatedRepo)
  as huggingface_hub's ``hf_raise_for_status`` expects.
* ``GET /cdn/{sha256}`` -- the bytes, with ``Range`` support (206 + ``Content-Range``).

Knobs for failure tests: a bandwidth limit, dropping the connection once after N bytes of a
file, serving corrupted bytes (always, or for the next body only), a token required by gated
repos. GGUF files (one file, or the ``-0000N-of-0000M.gguf`` parts of a split one) are LFS
files like safetensors: a repo of GGUF files alone, without config.json, is served as the Hub
serves the GGUF repos (``add_repo(repo, extra={...})``). Every request is logged
(method, path, Range, status, bytes sent).

Hostile or broken modes (a mirror or a man in the middle must not be able to harm the client):
any revision answered with the repo's commit, a commit id (``sha``) or a file name that is a
path, ETags and listed hashes that are paths, a body that runs past its declared size (with or
without a Content-Length that admits it), and a body that stops arriving (a stall).

This module holds the content, the knobs and the log; tests/engine/hub/hub_handler.py answers.
"""
from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from http.server import ThreadingHTTPServer
from pathlib import Path

from tests.engine.hub.hub_handler import handler_for

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".onnx")


def git_blob_id(data: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


@dataclass
class ServedFile:
    path: str
    data: bytes
    lfs: bool

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    @property
    def pointer(self) -> bytes:
        return (f"version https://git-lfs.github.com/spec/v1\noid sha256:{self.sha256}\nsize {len(self.data)}\n").encode()

    @property
    def blob_id(self) -> str:
        """The git object id: of the LFS pointer for LFS files, of the content otherwise."""
        return git_blob_id(self.pointer if self.lfs else self.data)


@dataclass
class ServedRepo:
    repo_id: str
    commit: str
    files: dict[str, ServedFile]
    gated: bool = False


@dataclass
class Stall:
    """Send the file's bytes up to offset ``after_bytes``, then nothing until released (or
    ``hold_s`` passed), for the next ``times`` requests of that file."""

    after_bytes: int
    times: int = 1
    hold_s: float = 30.0


@dataclass(frozen=True)
class Logged:
    method: str
    kind: str            # "api", "resolve" or "cdn"
    repo: str | None
    path: str | None
    range: str | None
    status: int
    bytes_sent: int
    authorized: bool


@dataclass
class FakeHub:
    token: str = "hf_tandem_test_token"
    rate_bps: float | None = None                     # bandwidth limit for file bodies
    drop_once: dict[str, int] = field(default_factory=dict)  # sha256 -> drop the connection after N bytes, once
    corrupt: set[str] = field(default_factory=set)    # sha256 of files served with one byte flipped
    corrupt_once: set[str] = field(default_factory=set)  # ...for their next body only
    repos: dict[str, ServedRepo] = field(default_factory=dict)
    log: list[Logged] = field(default_factory=list)
    # --- hostile or broken modes ---
    any_revision: bool = False                        # answer every revision with the repo's commit
    etag_as: dict[str, str] = field(default_factory=dict)         # sha256 -> ETag sent instead of the real one
    listed_hash_as: dict[str, str] = field(default_factory=dict)  # sha256 -> hash the listing publishes instead
    overlong: dict[str, tuple[int, bool]] = field(default_factory=dict)  # sha256 -> (extra bytes, Content-Length admits them)
    endless: set[str] = field(default_factory=set)    # sha256 of files whose body never ends (no Content-Length)
    endless_cap: int = 64 << 20                       # ...well, ends after this many bytes, so a broken client cannot fill the disk
    stalls: dict[str, Stall] = field(default_factory=dict)  # sha256 -> stall its next bodies
    endless_listing: bool = False                     # the model-info answer never ends (up to endless_cap)

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._sending = 0
        self._servers: list[ThreadingHTTPServer] = []
        self.url = self.cdn_url = ""

    # --- content ---------------------------------------------------------------------------

    def add_repo(self, repo_id: str, folder: Path | None = None, gated: bool = False,
                 extra: dict[str, bytes] | None = None) -> ServedRepo:
        """Serve every file under ``folder`` (plus ``extra`` path -> bytes) as repo ``repo_id``."""
        files = {}
        for p in sorted(Path(folder).rglob("*") if folder is not None else ()):
            if p.is_file():
                rel = p.relative_to(folder).as_posix()
                files[rel] = ServedFile(rel, p.read_bytes(), rel.endswith(LFS_SUFFIXES))
        for rel, data in (extra or {}).items():
            files[rel] = ServedFile(rel, data, rel.endswith(LFS_SUFFIXES))
        digest = hashlib.sha1(repo_id.encode())
        for rel in sorted(files):
            digest.update(rel.encode() + files[rel].sha256.encode())
        repo = ServedRepo(repo_id, digest.hexdigest(), files, gated)
        self.repos[repo_id] = repo
        return repo

    def file(self, repo_id: str, path: str) -> ServedFile:
        return self.repos[repo_id].files[path]

    def corrupt_file(self, repo_id: str, path: str, once: bool = False) -> None:
        (self.corrupt_once if once else self.corrupt).add(self.file(repo_id, path).sha256)

    def _take_corrupt(self, sha: str) -> bool:
        with self._lock:
            if sha in self.corrupt_once:
                self.corrupt_once.discard(sha)
                return True
            return sha in self.corrupt

    def drop_file_once(self, repo_id: str, path: str, after_bytes: int) -> None:
        self.drop_once[self.file(repo_id, path).sha256] = after_bytes

    def serve_commit_as(self, repo_id: str, sha: str) -> None:
        """The model-info endpoint reports ``sha`` as the commit (and resolve accepts it)."""
        self.repos[repo_id].commit = sha

    def send_etag_as(self, repo_id: str, path: str, etag: str) -> None:
        self.etag_as[self.file(repo_id, path).sha256] = etag

    def list_hash_as(self, repo_id: str, path: str, value: str) -> None:
        self.listed_hash_as[self.file(repo_id, path).sha256] = value

    def send_overlong(self, repo_id: str, path: str, extra: int, declared: bool) -> None:
        self.overlong[self.file(repo_id, path).sha256] = (extra, declared)

    def send_endless(self, repo_id: str, path: str) -> None:
        self.endless.add(self.file(repo_id, path).sha256)

    def stall_file(self, repo_id: str, path: str, after_bytes: int, times: int = 1, hold_s: float = 30.0) -> None:
        self.stalls[self.file(repo_id, path).sha256] = Stall(after_bytes, times, hold_s)
        self._release.clear()

    def release_stalls(self) -> None:
        """Let every stalled body end (the connection is closed without the rest)."""
        self.stalls.clear()
        self._release.set()

    def _take_stall(self, sha: str) -> Stall | None:
        with self._lock:
            stall = self.stalls.get(sha)
            if stall is None:
                return None
            stall.times -= 1
            if stall.times <= 0:
                del self.stalls[sha]
            return stall

    def _by_sha(self, sha: str) -> tuple[str, ServedFile] | None:
        for repo in self.repos.values():
            for f in repo.files.values():
                if f.lfs and f.sha256 == sha:
                    return repo.repo_id, f
        return None

    # --- log -------------------------------------------------------------------------------

    def record(self, entry: Logged) -> None:
        with self._lock:
            self.log.append(entry)

    def gets(self, repo_id: str, path: str) -> list[Logged]:
        """Body-carrying GETs of one file (CDN or direct)."""
        with self._lock:
            return [e for e in self.log if e.method == "GET" and e.kind in ("cdn", "resolve")
                    and e.repo == repo_id and e.path == path and e.status in (200, 206)]

    def requests(self) -> list[Logged]:
        with self._lock:
            return list(self.log)

    @property
    def sending(self) -> int:
        """How many file bodies are being sent now (a stalled one included)."""
        with self._lock:
            return self._sending

    def wait_idle(self, timeout: float = 5.0) -> None:
        """Until no file body is being sent (a client that went away is noticed at the next
        write), so the log is complete."""
        deadline = time.monotonic() + timeout
        while self._sending and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not self._sending, "the server is still sending a body"

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> "FakeHub":
        for attr in ("url", "cdn_url"):
            server = ThreadingHTTPServer(("127.0.0.1", 0), handler_for(self))
            server.daemon_threads = True
            threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
            self._servers.append(server)
            setattr(self, attr, f"http://127.0.0.1:{server.server_address[1]}")
        return self

    def close(self) -> None:
        self._release.set()
        for server in self._servers:
            server.shutdown()
            server.server_close()
        self._servers.clear()

    def __enter__(self) -> "FakeHub":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()
