"""Deciding what the download of a GGUF variant fetches: one quantization's file (or every part
of a split one) of a target, and its drafter's GGUF file -- nothing else of either repo.

A variant is described as the catalog describes it (``engine.models.planning.variants.GgufVariant``, on
``CatalogEntry.variants`` / ``drafter_variants``): ``quant``, ``repo``, ``files`` and the
expected total ``file_bytes``; anything with those attributes plugs in (``GgufSource`` here is
the same shape, for a variant the catalog does not list). The Hub's listing of the repo is the
authority on each file: its size (what the free-space check and the transfer go by: the
catalog's figure may be an estimate) and its LFS sha256 (what the finished file must match). A split variant named by its first part alone
(``name-00001-of-00003.gguf``) brings its other parts. The download itself is the same as for
a model folder (``engine.hub.download.download_events``): resumable, verified, cancellable.
"""
from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.hub.cache import hub_cache_dir, read_installed
from engine.hub.files import HubFile
from engine.hub.plan import (
    DownloadPlan,
    HubError,
    Planner,
    RepoDownload,
    catalog_entry,
    hub_endpoint,
    hub_error,
)
from engine.hub.safe_names import revision as checked_revision

if TYPE_CHECKING:
    from engine.models.planning.variants import GgufVariant

log = logging.getLogger(__name__)

# llama.cpp's gguf-split naming, as engine.gguf.reader.SPLIT_NAME (not imported: it brings torch).
SPLIT_NAME = re.compile(r"^(?P<stem>.+)-(?P<no>\d{5})-of-(?P<count>\d{5})\.gguf$")
SHOWN_FILES = 12  # how many of a repo's GGUF files an error message lists


@dataclass(frozen=True)
class GgufSource:
    """One GGUF variant of a model: ``files`` in ``repo`` (one .gguf, or the parts of a split
    one: naming the first part is enough) and, optionally, the bytes they are expected to
    total (0: unknown)."""

    quant: str
    repo: str
    files: tuple[str, ...]
    file_bytes: int = 0


def split_part_names(path: str) -> tuple[str, ...]:
    """Every part of the split set ``path`` belongs to (repo paths), or just ``path``."""
    folder, _, name = path.rpartition("/")
    match = SPLIT_NAME.match(name)
    if match is None:
        return (path,)
    prefix = f"{folder}/" if folder else ""
    count = int(match["count"])
    return tuple(f"{prefix}{match['stem']}-{i:05d}-of-{count:05d}.gguf" for i in range(1, count + 1))


def _missing(source: GgufVariant | GgufSource, repo_files: Sequence[HubFile], names: Sequence[str]) -> HubError:
    ggufs = sorted(f.path for f in repo_files if f.path.endswith(".gguf"))
    shown = ", ".join(ggufs[:SHOWN_FILES]) + (f" and {len(ggufs) - SHOWN_FILES} more" if len(ggufs) > SHOWN_FILES else "")
    return HubError(
        f"{source.repo} has no {', '.join(names)} (the {source.quant} GGUF variant) on the Hub;"
        f" its GGUF files are: {shown or 'none'}. The catalog may be out of date with the repo.", "not_found")


def variant_files(source: GgufVariant | GgufSource, repo_files: Sequence[HubFile]) -> tuple[HubFile, ...]:
    """The listing's entries for ``source``'s files, split sets completed, in part order.
    Raises HubError("not_found") naming what is missing and what the repo has."""
    by_path = {f.path: f for f in repo_files}
    wanted: list[str] = []
    for name in source.files:
        for part in split_part_names(name):
            if part not in wanted:
                wanted.append(part)
    missing = [n for n in wanted if n not in by_path]
    if missing:
        raise _missing(source, repo_files, missing)
    if not all(n.endswith(".gguf") for n in wanted):
        raise HubError(f"{source.repo}: the {source.quant} variant names files that are not GGUF: {', '.join(wanted)}",
                       "not_found")
    sets = {split_part_names(n)[0] for n in wanted}
    if len(sets) != 1:
        raise HubError(f"{source.repo}: the {source.quant} variant names several models ({', '.join(sorted(sets))});"
                       " a variant is one .gguf file or the parts of one split file", "not_found")
    files = tuple(by_path[n] for n in wanted)
    expected, listed = getattr(source, "file_bytes", 0) or 0, sum(f.size for f in files)
    if expected and expected != listed and all(f.size >= 0 for f in files):
        # The listing is what the bytes are checked against; the catalog's figure only informs
        # (it is an estimate where its size_source is "computed").
        level = logging.INFO if getattr(source, "size_source", "") == "computed" else logging.WARNING
        log.log(level, "%s %s: the catalog expects %s bytes, the Hub lists %s; going by the Hub",
                source.repo, source.quant, f"{expected:,}", f"{listed:,}")
    return files


def _installed_unit(source: GgufVariant | GgufSource, revision: str) -> RepoDownload | None:
    found = read_installed(source.repo, None, revision, source.quant)
    if found is None or found.entry_file is None:
        return None
    have = {f.path for f in found.files}
    if not set(source.files) <= have or split_part_names(found.entry_file)[0] != split_part_names(source.files[0])[0]:
        return None  # the catalog now names other files for this quantization
    return RepoDownload(source.repo, revision, found.commit, None, found.files, source.quant, installed=True,
                        entry_file=found.entry_file)


def gguf_unit(planner: Planner, source: GgufVariant | GgufSource, revision: str = "main") -> RepoDownload:
    """The download of one variant: the installed copy when there is one (no network), else
    its files as the Hub lists them at the commit ``revision`` resolves to."""
    if not source.files:
        raise HubError(f"{source.repo}: the {source.quant} variant names no files", "not_found")
    installed = _installed_unit(source, revision)
    if installed is not None:
        return installed
    commit, listing, gated = planner.listing(source.repo, revision)
    files = planner.fill_sizes(source.repo, commit, variant_files(source, listing))  # a mirror may list no sizes
    if gated:
        planner.check_access(source.repo, commit, files[0])
    return RepoDownload(source.repo, revision, commit, None, files, source.quant, entry_file=files[0].path)


def plan_gguf_download(target: GgufVariant | GgufSource, drafter: GgufVariant | GgufSource | None = None, *,
                       revision: str = "main", token: str | bool | None = None,
                       made_for_target: tuple[str, str] | None = None) -> DownloadPlan:
    """What ``download_events`` fetches for GGUF variant ``target`` (at ``revision``) and its
    drafter's variant ``drafter`` (at main), or the target alone. ``made_for_target``: (repo,
    kind) of an EAGLE-3 / DFlash checkpoint to fetch as the drafter instead, its whole folder at
    main (a config and safetensors: such drafters have no GGUF files). Raises ``HubError``."""
    endpoint, cache = hub_endpoint(), hub_cache_dir()
    planner = Planner(endpoint, cache, token)
    current = target.repo
    try:
        revision = checked_revision(revision, target.repo)
        target_unit = gguf_unit(planner, target, revision)
        drafter_unit = None
        if made_for_target is not None:
            current = made_for_target[0]
            drafter_unit = planner.unit(made_for_target[0], "main", None, None)
        elif drafter is not None:
            current = drafter.repo
            drafter_unit = gguf_unit(planner, drafter, "main")
            if (drafter_unit.repo, drafter_unit.entry_file) == (target_unit.repo, target_unit.entry_file):
                raise HubError(f"{target.repo}/{target_unit.entry_file} cannot be its own drafter", "mismatch")
    except Exception as exc:
        raise hub_error(exc, current, endpoint) from exc
    kind = made_for_target[1] if made_for_target is not None else "draft_model"
    plan = DownloadPlan(target_unit, drafter_unit, kind if drafter_unit else None,
                        "catalog" if drafter_unit else "none", False, endpoint, cache, token)
    log.info("plan: %s %s (%d files, %d bytes)%s", target.repo, target.quant, len(target_unit.files), target_unit.size,
             f" + drafter {drafter_unit.repo} {drafter_unit.precision or plan.drafter_kind}" if drafter_unit else "")
    return plan


# --- variants from the catalog --------------------------------------------------------------------

def catalog_variants(entry) -> tuple[tuple, tuple]:
    """(the target's GGUF variants, the drafter's) of a catalog entry; empty where it has none."""
    return tuple(getattr(entry, "variants", None) or ()), tuple(getattr(entry, "drafter_variants", None) or ())


def _available(variants) -> str:
    return ", ".join(v.quant for v in variants) or "none"


def choose_variant(entry, name: str):
    """The entry's target variant called ``name`` (case-insensitive). Raises HubError
    ("not_found") that lists the variants there are."""
    variants, _ = catalog_variants(entry)
    for v in variants:
        if v.quant.lower() == name.strip().lower():
            return v
    if not variants:
        raise HubError(f"{entry.id} has no GGUF variants in Tandem's catalog; download it without --variant"
                       " for its safetensors weights", "not_found")
    raise HubError(f"{entry.id} has no GGUF variant {name!r}; available: {_available(variants)}", "not_found")


def drafter_variant_for(entry, target_variant):
    """The drafter's GGUF variant to pair with ``target_variant``: the same quantization when
    the catalog has it, else the first the catalog lists (its choice); None when it has none
    (engine.models.planning.variants.paired_drafter_variant: the memory fit budgets the same file)."""
    from engine.models.planning.variants import paired_drafter_variant

    _, drafters = catalog_variants(entry)
    return paired_drafter_variant(target_variant, drafters)


def plan_variant_download(repo_or_id: str, variant: str, drafter: bool = True, *, revision: str = "main",
                          token: str | bool | None = None) -> DownloadPlan:
    """``plan_gguf_download`` for the catalog entry ``repo_or_id``'s variant ``variant`` and the
    drafter variant paired with it (``drafter=False``: the target only)."""
    entry = catalog_entry(repo_or_id)
    if entry is None:
        raise HubError(f"{repo_or_id!r} is not in Tandem's catalog, so it has no GGUF variants to choose from",
                       "not_found")
    target = choose_variant(entry, variant)
    from engine.models.planning.catalog import MADE_FOR_TARGET_KINDS

    if drafter and entry.drafter_kind in MADE_FOR_TARGET_KINDS:
        return plan_gguf_download(target, None, revision=revision, token=token,
                                  made_for_target=(entry.drafter_repo, entry.drafter_kind))
    paired = drafter_variant_for(entry, target) if drafter else None
    if drafter and paired is None and entry.drafter_kind == "draft_model":
        log.info("%s: the catalog has no GGUF file for its drafter; fetching the target only", entry.id)
    return plan_gguf_download(target, paired, revision=revision, token=token)
