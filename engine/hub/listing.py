"""A repo's listing from the Hub (the model-info endpoint with blob metadata), read with bounds.

``HfApi.model_info`` reads the whole answer into memory with no limit on its size or on how
long it takes, so a server that never ends its answer would exhaust memory or hang the plan.
This is the same request (same URL, headers, errors through ``hf_raise_for_status``, the same
``ModelInfo`` parsing), read in chunks and refused past ``MAX_LISTING_BYTES`` or
``LISTING_DEADLINE_S``; then every name in it that will become a path is checked
(``engine.hub.files.files_from_listing``, ``engine.hub.safe_names``).
"""
from __future__ import annotations

import time
from urllib.parse import quote

from engine.hub.files import HubFile, files_from_listing
from engine.hub.safe_names import COMMIT, UnsafeName, commit_id
from engine.hub.transfer import http_library

MAX_LISTING_BYTES = 64 << 20  # the largest real listings (repos of thousands of files) are a few MB
LISTING_DEADLINE_S = 60.0     # a listing trickled byte by byte must end too


def listed_commit(sha: object, repo: str, revision: str) -> str:
    """The commit a listing reports, checked: it names the snapshot folder, and a commit asked
    for by id must be the one answered."""
    commit = commit_id(sha, repo)
    if COMMIT.fullmatch(revision) and commit != revision:
        raise UnsafeName(f"{repo}: asked for commit {revision} but the Hub answered commit {commit}; refusing it.")
    return commit


def _read_bounded(response, repo: str) -> bytes:
    body = bytearray()
    deadline = time.monotonic() + LISTING_DEADLINE_S
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > MAX_LISTING_BYTES:
            raise UnsafeName(f"{repo}: the Hub's file listing ran past {MAX_LISTING_BYTES >> 20} MB; refusing it.")
        if time.monotonic() > deadline:
            raise UnsafeName(f"{repo}: the Hub's file listing took more than {LISTING_DEADLINE_S:g} s to arrive;"
                             " refusing it.")
    return bytes(body)


def fetch_listing(endpoint: str, token: str | bool | None, repo: str, revision: str,
                  timeout: float) -> tuple[str, tuple[HubFile, ...], object]:
    """(commit, files, gated flag) of ``repo`` at ``revision``, every name checked."""
    from huggingface_hub.hf_api import ModelInfo
    from huggingface_hub.utils import build_hf_headers, get_session, hf_raise_for_status

    url = f"{endpoint}/api/models/{repo}/revision/{quote(revision, safe='')}"
    with get_session().stream("GET", url, headers=build_hf_headers(token=token), params={"blobs": True},
                              timeout=timeout, follow_redirects=True) as streamed:
        body = _read_bounded(streamed, repo)  # decoded bytes: a compressed answer is bounded as it unpacks
        headers = {k: v for k, v in streamed.headers.items() if k.lower() not in ("content-encoding", "content-length")}
        response = http_library().Response(streamed.status_code, headers=headers, content=body, request=streamed.request)
    hf_raise_for_status(response)
    info = ModelInfo(**response.json())
    return listed_commit(info.sha, repo, revision), files_from_listing(info.siblings or [], repo), info.gated
