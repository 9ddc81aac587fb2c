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
file, serving corrupted bytes, a token required by gated repos. Every request is logged
(method, path, Range, status, bytes sent).

Hostile or broken modes (a mirror or a man in the middle must not be able to harm the client):
any revision answered with the repo's commit, a commit id (``sha``) or a file name that is a
path, ETags and listed hashes that are paths, a body that runs past its declared size (with or
without a Content-Length that admits it), and a body that stops arriving (a stall).
"""
from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

LFS_SUFFIXES = (".safetensors", ".bin", ".gguf", ".pt", ".onnx")
SEND_CHUNK = 16 << 10


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

    def __post_init__(self) -> None:
        self._lock = threading.Lock()
        self._release = threading.Event()
        self._sending = 0
        self._servers: list[ThreadingHTTPServer] = []
        self.url = self.cdn_url = ""

    # --- content ---------------------------------------------------------------------------

    def add_repo(self, repo_id: str, folder: Path, gated: bool = False, extra: dict[str, bytes] | None = None) -> ServedRepo:
        """Serve every file under ``folder`` (plus ``extra`` path -> bytes) as repo ``repo_id``."""
        files = {}
        for p in sorted(Path(folder).rglob("*")):
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

    def corrupt_file(self, repo_id: str, path: str) -> None:
        self.corrupt.add(self.file(repo_id, path).sha256)

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

    def stall_file(self, repo_id: str, path: str, after_bytes: int, times: int = 1) -> None:
        self.stalls[self.file(repo_id, path).sha256] = Stall(after_bytes, times)
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
            server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(self))
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


_API = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)??)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+|[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(?P<start>\d+)-(?P<end>\d*)$")


def _handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:  # keep test output clean
            pass

        def do_HEAD(self) -> None:
            self._route(head=True)

        def do_GET(self) -> None:
            self._route(head=False)

        # --- helpers -----------------------------------------------------------------------

        @property
        def authorized(self) -> bool:
            return self.headers.get("Authorization") == f"Bearer {hub.token}"

        def _log(self, kind, repo, path, status, sent=0) -> None:
            hub.record(Logged(self.command, kind, repo, path, self.headers.get("Range"), status, sent, self.authorized))

        def _reply(self, status: int, headers: dict[str, str], body: bytes = b"", head: bool = False) -> None:
            self.send_response(status)
            for k, v in headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", headers.get("Content-Length", str(len(body))))
            self.end_headers()
            if body and not head:
                self.wfile.write(body)

        def _error(self, status: int, code: str, message: str, head: bool, extra: dict[str, str] | None = None) -> None:
            body = json.dumps({"error": message}).encode()
            headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json", **(extra or {})}
            self._reply(status, headers, body, head)

        def _route(self, head: bool) -> None:
            path = urlsplit(self.path).path
            if m := _CDN.match(path):
                return self._cdn(m["sha"], head)
            if m := _API.match(path):
                return self._api(unquote(m["repo"]), unquote(m["rev"] or "main"), head)
            if m := _RESOLVE.match(path):
                return self._resolve(unquote(m["repo"]), unquote(m["rev"]), unquote(m["path"]), head)
            self._error(404, "NotFound", f"no route for {path}", head)
            self._log("other", None, path, 404)

        def _repo_at(self, repo_id: str, rev: str, head: bool) -> ServedRepo | None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                self._error(404, "RepoNotFound", "Repository not found", head)
                return None
            if rev not in ("main", repo.commit) and not hub.any_revision:
                self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
                return None
            return repo

        # --- endpoints -----------------------------------------------------------------------

        def _api(self, repo_id: str, rev: str, head: bool) -> None:
            repo = self._repo_at(repo_id, rev, head)
            if repo is None:
                return self._log("api", repo_id, None, 404)
            siblings = []
            for f in repo.files.values():
                listed = hub.listed_hash_as.get(f.sha256)
                entry = {"rfilename": f.path, "size": len(f.pointer if f.lfs else f.data),
                         "blobId": f.blob_id if listed is None or f.lfs else listed}
                if f.lfs:
                    entry["size"] = len(f.data)
                    entry["lfs"] = {"sha256": listed or f.sha256, "size": len(f.data), "pointerSize": len(f.pointer)}
                siblings.append(entry)
            info = {"_id": str(repo.commit)[:24], "id": repo.repo_id, "modelId": repo.repo_id, "sha": repo.commit,
                    "private": False, "disabled": False, "gated": "auto" if repo.gated else False,
                    "tags": [], "siblings": siblings}
            self._reply(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), head)
            self._log("api", repo_id, None, 200)

        def _resolve(self, repo_id: str, rev: str, path: str, head: bool) -> None:
            repo = self._repo_at(repo_id, rev, head)
            if repo is None:
                return self._log("resolve", repo_id, path, 404)
            if repo.gated and not self.authorized:
                self._error(401, "GatedRepo", f"Access to model {repo_id} is restricted. You must have access to it"
                                              " and be authenticated to access it. Please log in.", head)
                return self._log("resolve", repo_id, path, 401)
            f = repo.files.get(path)
            if f is None:
                self._error(404, "EntryNotFound", f"{path} does not exist on \"{rev}\"", head,
                            {"X-Repo-Commit": repo.commit})
                return self._log("resolve", repo_id, path, 404)
            common = {"X-Repo-Commit": repo.commit, "Accept-Ranges": "bytes"}
            etag = hub.etag_as.get(f.sha256)
            if f.lfs:
                headers = {**common, "ETag": f'"{f.blob_id}"', "X-Linked-Etag": f'"{etag or f.sha256}"',
                           "X-Linked-Size": str(len(f.data)), "Location": f"{hub.cdn_url}/cdn/{f.sha256}"}
                self._reply(302, headers, b"", head)
                return self._log("resolve", repo_id, path, 302)
            self._body(f, {**common, "ETag": f'"{etag or f.blob_id}"'}, head, "resolve", repo_id)

        def _cdn(self, sha: str, head: bool) -> None:
            found = hub._by_sha(sha)
            if found is None:
                self._reply(404, {}, b"no such object", head)
                return self._log("cdn", None, sha, 404)
            repo_id, f = found
            self._body(f, {"ETag": f'"{sha}"', "Accept-Ranges": "bytes"}, head, "cdn", repo_id)

        def _body(self, f: ServedFile, headers: dict[str, str], head: bool, kind: str, repo_id: str) -> None:
            data = f.data
            if f.sha256 in hub.corrupt:
                middle = len(data) // 2
                data = data[:middle] + bytes([data[middle] ^ 0xFF]) + data[middle + 1:]
            start, end, status = 0, len(data) - 1, 200
            if (rng := self.headers.get("Range")) and (m := _RANGE.match(rng)):
                start = int(m["start"])
                end = int(m["end"]) if m["end"] else len(data) - 1
                if start >= len(data):
                    self._reply(416, {"Content-Range": f"bytes */{len(data)}"}, b"", head)
                    return self._log(kind, repo_id, f.path, 416)
                status = 206
                headers = {**headers, "Content-Range": f"bytes {start}-{end}/{len(data)}"}
            part = data[start:end + 1]
            if head:
                self._reply(status, {**headers, "Content-Length": str(len(part))}, b"", head=True)
                return self._log(kind, repo_id, f.path, status)
            if f.sha256 in hub.endless:
                return self._endless(part, status, headers, kind, repo_id, f)
            extra, declared = hub.overlong.get(f.sha256, (0, False))
            if extra:
                part += bytes(extra)  # zeros past the end of the file
            length = len(part) if declared or not extra else len(part) - extra
            if extra and not declared:
                self.close_connection = True  # the surplus follows a body of the length announced
            self._reply(status, {**headers, "Content-Length": str(length)}, b"", head=True)
            drop_after = None
            if self.command == "GET":
                with hub._lock:
                    drop_after = hub.drop_once.pop(f.sha256, None)
            stall = hub._take_stall(f.sha256)
            sent = 0
            with hub._lock:
                hub._sending += 1
            try:
                for i in range(0, len(part), SEND_CHUNK):
                    piece = part[i:i + SEND_CHUNK]
                    if stall is not None and start + sent + len(piece) >= stall.after_bytes:
                        self.wfile.write(piece[: max(0, stall.after_bytes - start - sent)])
                        sent = max(sent, stall.after_bytes - start)
                        self.wfile.flush()
                        hub._release.wait(stall.hold_s)  # silence: the connection stays open, nothing arrives
                        self.close_connection = True
                        break
                    if drop_after is not None and sent + len(piece) >= drop_after:
                        self.wfile.write(piece[: max(0, drop_after - sent)])
                        sent = drop_after
                        self.wfile.flush()
                        self.close_connection = True  # the client sees a body shorter than Content-Length
                        break
                    self.wfile.write(piece)
                    sent += len(piece)
                    if hub.rate_bps:
                        time.sleep(len(piece) / hub.rate_bps)
            except (BrokenPipeError, ConnectionResetError):
                self.close_connection = True  # the client went away (cancelled)
            finally:
                self._log(kind, repo_id, f.path, status, sent)
                with hub._lock:
                    hub._sending -= 1

        def _endless(self, part: bytes, status: int, headers: dict[str, str], kind: str, repo_id: str, f: ServedFile) -> None:
            """The file, then zeros until the client hangs up (or ``endless_cap``): no
            Content-Length, the end of the body is the end of the connection."""
            self.close_connection = True
            self.send_response(status)
            for k, v in {**headers, "Connection": "close"}.items():
                self.send_header(k, v)
            self.end_headers()
            sent = 0
            with hub._lock:
                hub._sending += 1
            try:
                self.wfile.write(part)
                sent = len(part)
                filler = bytes(SEND_CHUNK)
                while sent < hub.endless_cap:
                    self.wfile.write(filler)
                    sent += len(filler)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: what a careful client does
            finally:
                self._log(kind, repo_id, f.path, status, sent)
                with hub._lock:
                    hub._sending -= 1

    return Handler
