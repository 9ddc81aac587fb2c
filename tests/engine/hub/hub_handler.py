"""The request handler of the fake Hub (tests/engine/hub/hub_server.py): its routes, and how each
knob (bandwidth, drops, corruption, the hostile modes) shapes an answer."""
from __future__ import annotations

import json
import re
import time
from http.server import BaseHTTPRequestHandler
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

if TYPE_CHECKING:
    from tests.engine.hub.hub_server import FakeHub, ServedFile, ServedRepo

SEND_CHUNK = 16 << 10

_API = re.compile(r"^/api/models/(?P<repo>[^/]+(?:/[^/]+)??)(?:/revision/(?P<rev>[^/]+))?$")
_RESOLVE = re.compile(r"^/(?P<repo>[^/]+/[^/]+|[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")
_CDN = re.compile(r"^/cdn/(?P<sha>[0-9a-f]{64})$")
_RANGE = re.compile(r"^bytes=(?P<start>\d+)-(?P<end>\d*)$")


def handler_for(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    from tests.engine.hub.hub_server import Logged  # here: hub_server imports this module

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
            if hub.endless_listing and not head:
                return self._endless(b'{"siblings": [' + b" " * 64, 200, {"Content-Type": "application/json"}, "api",
                                     repo_id, None)
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
            if not head and hub._take_corrupt(f.sha256):
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

        def _endless(self, part: bytes, status: int, headers: dict[str, str], kind: str, repo_id: str,
                     f: ServedFile | None) -> None:
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
                filler = bytes(SEND_CHUNK) if f is not None else b" " * SEND_CHUNK  # a listing stays JSON-ish
                while sent < hub.endless_cap:
                    self.wfile.write(filler)
                    sent += len(filler)
            except (BrokenPipeError, ConnectionResetError):
                pass  # the client stopped reading: what a careful client does
            finally:
                self._log(kind, repo_id, f.path if f is not None else None, status, sent)
                with hub._lock:
                    hub._sending -= 1

    return Handler
