"""Deciding what a Hub download fetches, before any weights move.

``plan_download(repo_or_id, ...)`` resolves the target (a catalog id or a Hub repo) to a commit,
chooses its drafter (explicit, from the catalog pairing, remembered from an earlier download, a
drafter folder inside the repo, or ``<repo>-assistant`` when that repo exists) and lists the
files each needs (``engine.hub.files``). Models already installed need no network at all, so
they work offline. Anything the user must act on raises ``HubError`` with a ``kind``.
"""
from __future__ import annotations

import errno
import logging
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from engine.hub import cache as hub_cache
from engine.hub.cache import hub_cache_dir, read_installed, snapshot_dir
from engine.hub.events import (
    FailureKind,
)
from engine.hub.files import (
    DEFAULT_PRECISIONS,
    HubFile,
    NoUsableWeights,
    byte_count,
    find_sidecar,
    select_files,
)
from engine.hub.listing import fetch_listing
from engine.hub.safe_names import UnsafeName
from engine.hub.safe_names import revision as checked_revision
from engine.hub.transfer import (
    METADATA_TIMEOUT_S,
    IntegrityError,
    Stopped,
    TransferFailed,
    transport_errors,
)

log = logging.getLogger(__name__)


class HubError(Exception):
    """A failure the user must act on; ``kind`` says which (see ``hub_events.FailureKind``)."""

    def __init__(self, message: str, kind: FailureKind) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class RepoDownload:
    """One model to fetch: ``repo`` at ``commit`` (what ``revision`` resolved to), the whole
    repo root or one ``subfolder`` (a drafter stored inside its target's repo). A single-file
    model (a GGUF variant: one file, or the parts of a split one) names the file a load opens
    in ``entry_file``, and its quantization in ``precision``."""

    repo: str
    revision: str
    commit: str
    subfolder: str | None
    files: tuple[HubFile, ...]
    precision: str | None = None
    installed: bool = False
    entry_file: str | None = None

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)

    def path(self, cache: Path) -> Path:
        return snapshot_dir(cache, self.repo, self.commit, self.subfolder)

    def load_path(self, cache: Path) -> Path:
        """What ``Session.load`` takes: the folder, or the entry file of a single-file model."""
        if self.entry_file is None:
            return self.path(cache)
        return hub_cache.pointer_path(cache, self.repo, self.commit, self.entry_file)


@dataclass(frozen=True)
class DownloadPlan:
    """What ``download_events`` will fetch. ``drafter_kind`` is "draft_model", "assistant",
    "mtp" or "lookup" (None: no drafter asked for); ``drafter_source`` says how it was chosen
    ("explicit", "catalog", "remembered", "sidecar", "convention" or "none")."""

    target: RepoDownload
    drafter: RepoDownload | None
    drafter_kind: str | None
    drafter_source: str
    cross_tokenizer: bool
    endpoint: str
    cache: Path
    token: str | bool | None = field(default=None, repr=False)

    @property
    def units(self) -> tuple[RepoDownload, ...]:
        return (self.target,) if self.drafter is None else (self.target, self.drafter)

    @property
    def total_bytes(self) -> int:
        return sum(u.size for u in self.units)

    @property
    def files(self) -> tuple[str, ...]:
        return tuple(f"{u.repo}/{f.path}" for u in self.units for f in u.files)

    @property
    def installed(self) -> bool:
        return all(u.installed for u in self.units)


# --- environment -------------------------------------------------------------------------------

def hub_endpoint() -> str:
    """HF_ENDPOINT read now (huggingface_hub reads it once, at import)."""
    from huggingface_hub import constants

    return (os.environ.get("HF_ENDPOINT") or constants.ENDPOINT).rstrip("/")


def is_offline() -> bool:
    from huggingface_hub import constants

    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return constants.is_offline_mode() or value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def disk_free_bytes(path: Path) -> int:
    """Free bytes on the disk holding ``path`` (its nearest existing parent)."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return 0


def _token_hint() -> str:
    from huggingface_hub import constants, get_token

    if get_token() is None:
        return "No Hugging Face token is set on this machine."
    where = "HF_TOKEN" if os.environ.get("HF_TOKEN") else constants.HF_TOKEN_PATH
    return f"The token in use (from {where}) does not have access to it yet."


def hub_error(exc: BaseException, repo: str, endpoint: str, file: str | None = None) -> HubError:
    """A clear message and kind for anything that can go wrong talking to the Hub; ``file``
    (a path in ``repo``) is named too when the failure happened while fetching it."""
    what = f"{repo}/{file}" if file else repo
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        HFValidationError,
        OfflineModeIsEnabled,
        RemoteEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    login = "log in with `hf auth login` (or set HF_TOKEN to a token from https://huggingface.co/settings/tokens)"
    if isinstance(exc, HubError):
        return exc
    if isinstance(exc, Stopped):
        return HubError(f"download of {repo} cancelled; run it again to resume where it stopped", "cancelled")
    if isinstance(exc, UnsafeName):
        return HubError(str(exc), "unsafe")
    if isinstance(exc, IntegrityError):
        return HubError(str(exc), "corrupt")
    if isinstance(exc, TransferFailed):
        return HubError(str(exc), "network")
    if isinstance(exc, NoUsableWeights):
        return HubError(f"{repo}: {exc}", "not_found")
    if isinstance(exc, HFValidationError):
        return HubError(f"{repo!r} is not a valid Hub repo id ({exc})", "not_found")
    if isinstance(exc, GatedRepoError):
        return HubError(
            f"{repo} is a gated model: accept its licence at {endpoint}/{repo}, then {login}."
            f" {_token_hint()}", "gated")
    if isinstance(exc, RepositoryNotFoundError):
        return HubError(
            f"No model {repo!r} on {endpoint}. Check the name; if it is private, {login}.", "not_found")
    if isinstance(exc, RevisionNotFoundError):
        return HubError(f"{repo} has no such revision on {endpoint}: {exc}", "not_found")
    if isinstance(exc, RemoteEntryNotFoundError):
        return HubError(f"{repo}: a file it lists is missing on {endpoint}: {exc}", "not_found")
    if isinstance(exc, HfHubHTTPError):
        status = exc.response.status_code if exc.response is not None else None
        if status in (401, 403):
            return HubError(f"{endpoint} refused access to {repo} (HTTP {status}): {login}. {_token_hint()}", "gated")
        return HubError(f"the Hub answered HTTP {status} for {repo}: {exc}", "network")
    if isinstance(exc, OfflineModeIsEnabled):
        return HubError(_offline_message(repo), "offline")
    if isinstance(exc, transport_errors()):
        name = type(exc).__name__
        if "Connect" in name:
            return HubError(
                f"Cannot reach the Hub at {endpoint} ({exc}). Models already downloaded still work;"
                f" connect to the internet and run again to fetch {repo}.", "offline")
        return HubError(f"network error while fetching {what} ({name}: {exc}); run again to resume", "network")
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", errno.ENOSPC)):
        return HubError(f"the disk filled up while fetching {what}: free some space and run again to resume"
                        " (what was written so far is kept)", "disk_full")
    return HubError(f"fetching {what} failed: {type(exc).__name__}: {exc}", "network")


def _offline_message(repo: str) -> str:
    return (f"{repo} is not downloaded yet and Tandem is offline (HF_HUB_OFFLINE is set)."
            " Unset HF_HUB_OFFLINE and connect to fetch it; models already downloaded still work.")


def catalog_entry(repo_or_id: str):
    """The catalog entry for an id or repo, or None (also when the catalog is absent)."""
    try:
        from engine.models.planning import catalog
    except ImportError:
        return None
    try:
        return catalog.find_entry(repo_or_id)
    except Exception:  # a broken catalog must not block downloading by repo name
        log.warning("catalog lookup failed for %s", repo_or_id, exc_info=True)
        return None


def _norm_precision(precision: str | None) -> str | None:
    return None if precision is None or precision.strip().lower() in DEFAULT_PRECISIONS else precision.strip()


# --- planning -------------------------------------------------------------------------------------

class Planner:
    """Remote look-ups for one plan, each repo's listing fetched at most once."""

    def __init__(self, endpoint: str, cache: Path, token: str | bool | None) -> None:
        self.endpoint, self.cache, self.token = endpoint, cache, token
        self._listings: dict[tuple[str, str], tuple[str, tuple[HubFile, ...], object]] = {}

    def listing(self, repo: str, revision: str) -> tuple[str, tuple[HubFile, ...], object]:
        """(commit, files, gated flag) of ``repo`` at ``revision``."""
        key = (repo, revision)
        if key not in self._listings:
            if is_offline():
                raise HubError(_offline_message(repo), "offline")
            from huggingface_hub.utils import validate_repo_id

            validate_repo_id(repo)
            self._listings[key] = fetch_listing(self.endpoint, self.token, repo, revision, METADATA_TIMEOUT_S)
        return self._listings[key]

    def exists(self, repo: str) -> bool:
        from huggingface_hub.errors import RepositoryNotFoundError

        try:
            self.listing(repo, "main")
            return True
        except RepositoryNotFoundError:
            return False

    def check_access(self, repo: str, commit: str, first: HubFile) -> None:
        """Gated repos publish their listing to everyone; a HEAD on one file tells whether we
        may download, before the user watches a progress bar fail."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        get_hf_file_metadata(hf_hub_url(repo, first.path, revision=commit, endpoint=self.endpoint),
                             token=self.token, timeout=METADATA_TIMEOUT_S, endpoint=self.endpoint)

    def fill_sizes(self, repo: str, commit: str, files: tuple[HubFile, ...]) -> tuple[HubFile, ...]:
        """Mirrors that list files without blob metadata: ask each file's size with a HEAD."""
        from huggingface_hub import get_hf_file_metadata, hf_hub_url

        filled = []
        for f in files:
            if f.size < 0:
                meta = get_hf_file_metadata(hf_hub_url(repo, f.path, revision=commit, endpoint=self.endpoint),
                                            token=self.token, timeout=METADATA_TIMEOUT_S, endpoint=self.endpoint)
                f = HubFile(f.path, max(byte_count(meta.size, repo, f.path), 0), f.sha256, f.git_sha1)
            filled.append(f)
        return tuple(filled)

    def unit(self, repo: str, revision: str, subfolder: str | None, precision: str | None) -> RepoDownload:
        """The installed copy when there is one (no network), else the remote listing."""
        found = read_installed(repo, subfolder, revision, precision)
        if found is not None:
            return RepoDownload(repo, revision, found.commit, subfolder, found.files, precision, installed=True)
        commit, listing, gated = self.listing(repo, revision)
        files = self.fill_sizes(repo, commit, select_files(listing, subfolder, precision))
        if gated:
            self.check_access(repo, commit, files[0])
        return RepoDownload(repo, revision, commit, subfolder, files, precision)


def _choose_drafter(planner: Planner, target: RepoDownload, entry, drafter_repo: str | None
                    ) -> tuple[str | None, str | None, str | None, str]:
    """(drafter repo, subfolder, kind, source); repo None means nothing to fetch."""
    if drafter_repo:
        kind = "assistant" if drafter_repo.endswith("-assistant") else "draft_model"
        return drafter_repo, None, kind, "explicit"
    kind = entry.drafter_kind if entry is not None else None
    if entry is not None and entry.drafter_repo:
        return entry.drafter_repo, None, kind, "catalog"
    if entry is not None and kind != "mtp":
        return None, None, kind, "catalog"  # "lookup": prompt lookup needs no download
    remembered = hub_cache.remembered_pair(target.repo)
    if remembered is not None:
        return remembered[0], remembered[1], kind or remembered[2], "remembered"
    try:
        return _discover_drafter(planner, target, kind)
    except Exception as exc:
        if not target.installed:
            raise
        # The target works without the Hub; a drafter search that needs it must not stop it.
        log.info("could not look for a drafter for %s (%s); continuing without one", target.repo, exc)
        return None, None, kind, "none"


def _discover_drafter(planner: Planner, target: RepoDownload, kind: str | None
                      ) -> tuple[str | None, str | None, str | None, str]:
    """By convention: a drafter folder inside the repo, else an ``<repo>-assistant`` repo.
    A catalog "mtp" entry without a drafter repo only looks inside (else the heads are built in)."""
    if is_offline():
        return None, None, kind, "none"
    sidecar = find_sidecar(planner.listing(target.repo, target.revision)[1])
    if sidecar is not None:
        return target.repo, sidecar[0], kind or sidecar[1], "catalog" if kind else "sidecar"
    if kind is None and planner.exists(f"{target.repo}-assistant"):
        return f"{target.repo}-assistant", None, "assistant", "convention"
    return None, None, kind, "catalog" if kind else "none"


def plan_download(repo_or_id: str, drafter: bool = True, precision: str | None = None, *,
                  drafter_repo: str | None = None, cross_tokenizer: bool = False, revision: str = "main",
                  token: str | bool | None = None) -> DownloadPlan:
    """Decide what to fetch for ``repo_or_id`` (a catalog id or a Hub repo) and its drafter.

    ``precision`` picks a weight variant: None (or "exact"/"fast") takes the repo's own
    safetensors; "fp16", "bf16"... take transformers-style variant files (model.fp16.safetensors);
    for a GGUF-only repo, a quantization name such as "Q4_K_M". ``drafter_repo`` overrides the
    pairing. ``token`` as in huggingface_hub (None: the stored login). Raises ``HubError``."""
    endpoint, cache = hub_endpoint(), hub_cache_dir()
    entry = catalog_entry(repo_or_id)
    target_repo = entry.target_repo if entry is not None else repo_or_id
    precision = _norm_precision(precision)
    planner = Planner(endpoint, cache, token)
    current = target_repo
    try:
        revision = checked_revision(revision, target_repo)  # it names refs/<revision>: checked before anything
        target = planner.unit(target_repo, revision, None, precision)
        d_repo, d_sub, kind, source = (None, None, None, "none")
        if drafter:
            d_repo, d_sub, kind, source = _choose_drafter(planner, target, entry, drafter_repo)
        if d_repo == target_repo and d_sub is None:
            raise HubError(f"{target_repo} cannot be its own drafter", "mismatch")
        drafter_unit = None
        if d_repo is not None:
            current = d_repo
            if d_repo == target_repo:  # a drafter folder inside the target's repo, same commit
                drafter_unit = planner.unit(d_repo, revision, d_sub, None)
            else:
                drafter_unit = planner.unit(d_repo, "main", d_sub, None)
    except Exception as exc:
        err = hub_error(exc, current, endpoint)
        if err.kind == "not_found" and entry is None and "/" not in repo_or_id and current == repo_or_id:
            err = HubError(f"{err} ({repo_or_id!r} is not in Tandem's catalog either.)", "not_found")
        raise err from exc
    plan = DownloadPlan(target, drafter_unit, kind if drafter else None, source, cross_tokenizer, endpoint, cache, token)
    log.info("plan: %s (%d files, %d bytes)%s", target.repo, len(target.files), target.size,
             f" + {drafter_unit.repo}{'/' + d_sub if d_sub else ''} as {kind} ({source})" if drafter_unit else "")
    return plan


# --- downloading ---------------------------------------------------------------------------------
