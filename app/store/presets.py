"""Named chat presets: a system prompt, sampling and speculation settings, one JSON file each.

The files live in ``data_dir()/presets`` so a person can copy, edit or share them. The ones that
ship in resources/presets are copied there the first time the folder is made (and only then: a
preset the person deleted stays deleted). A file that is not a valid preset is skipped with a
notice for the window; it is never a crash and never rewritten. That includes a file nested too
deep or too big to parse safely, and anything that is not a regular file (app/store/json_files.py).

Temperature 0 means greedy decoding (as in LM Studio and llama.cpp); above it the reply is sampled
with top-p / top-k and the seed, so a fixed seed repeats a reply.
"""
from __future__ import annotations

import json
import logging
import re
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from app.store import json_files
from engine.core.paths import RESOURCES
from engine.core.settings import MAX_DRAFT_LENGTH, DecodeSettings, InvalidRequest, OutputFormat

log = logging.getLogger(__name__)
BUNDLED = RESOURCES / "presets"
#: A preset is a few settings and a system prompt: a file past this is not one.
MAX_PRESET_BYTES = 1 * 2**20
#: "model": the loaded model's own drafter (a draft model or its MTP layers); "lookup": prompt
#: lookup; "off": plain decoding.
PRESET_DRAFTERS = ("model", "lookup", "off")
#: "text": free text; "json": any JSON object; "json_schema": JSON that follows ``json_schema``.
REPLY_FORMATS = ("text", "json", "json_schema")
#: A schema is a page or two of JSON; the engine refuses one past its own limit too.
MAX_SCHEMA_CHARS = 64 * 1024


class PresetSchema(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)

    name: str = Field(min_length=1, max_length=80)
    system_prompt: str = ""
    temperature: float = Field(0.0, ge=0.0, le=2.0)
    top_p: float = Field(1.0, gt=0.0, le=1.0)
    top_k: int = Field(0, ge=0)
    max_new_tokens: int = Field(512, ge=1, le=32768)
    seed: int = Field(0, ge=0)
    drafter: Literal[PRESET_DRAFTERS] = "model"
    draft_length: int | None = Field(None, ge=0, le=MAX_DRAFT_LENGTH)  # None: chosen per step
    reply_format: Literal[REPLY_FORMATS] = "text"  # added later: older presets have none
    json_schema: str = Field("", max_length=MAX_SCHEMA_CHARS)


@dataclass(frozen=True)
class Preset:
    name: str
    system_prompt: str = ""
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 512
    seed: int = 0
    drafter: str = "model"
    draft_length: int | None = None
    reply_format: str = "text"
    json_schema: str = ""

    def output_format(self) -> OutputFormat | None:
        """The reply's required form (engine.core.settings.OutputFormat); InvalidRequest where
        the schema is missing or is not JSON."""
        if self.reply_format == "json":
            return OutputFormat("json_object")
        if self.reply_format != "json_schema":
            return None
        if not self.json_schema.strip():
            raise InvalidRequest("the reply format is JSON schema, but no schema is given")
        try:
            json.loads(self.json_schema)
        except ValueError as exc:
            raise InvalidRequest(f"the JSON schema is not JSON: {exc}") from None
        return OutputFormat("json_schema", self.json_schema)

    def decode_settings(self) -> DecodeSettings:
        sampling = self.temperature > 0
        return DecodeSettings(
            output_format=self.output_format(),
            mode="sample" if sampling else "greedy",
            temperature=self.temperature if sampling else 0.7,
            top_p=self.top_p,
            top_k=self.top_k,
            max_new_tokens=self.max_new_tokens,
            seed=self.seed,
            draft_length=self.draft_length,
        )

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, raw: object) -> Preset:
        """Raises ValueError saying what is wrong when ``raw`` is not a preset."""
        try:
            checked = PresetSchema.model_validate(raw)
        except ValidationError as exc:
            problems = [f"{'.'.join(map(str, e['loc'])) or 'the file'}: {e['msg']}" for e in exc.errors()[:3]]
            raise ValueError("; ".join(problems)) from None
        return cls(**checked.model_dump())


@dataclass(frozen=True)
class SkippedPreset:
    path: Path
    reason: str


def file_name(name: str) -> str:
    """A safe, readable file name for a preset called ``name``."""
    slug = re.sub(r"[^A-Za-z0-9]+", "-", name).strip("-").lower()[:48]
    return f"{slug or 'preset'}.json"


class PresetStore:
    def __init__(self, directory: Path, bundled: Path = BUNDLED) -> None:
        self.directory = Path(directory)
        self.bundled = Path(bundled)
        self.skipped: tuple[SkippedPreset, ...] = ()

    def install_bundled(self) -> list[Path]:
        """First run (no presets folder yet): copy the shipped presets in. Returns what was copied."""
        if self.directory.exists():
            return []
        self.directory.mkdir(parents=True)
        copied = []
        for source in sorted(self.bundled.glob("*.json")):
            target = self.directory / source.name
            shutil.copyfile(source, target)
            copied.append(target)
        log.info("copied %d bundled preset(s) to %s", len(copied), self.directory)
        return copied

    def load_all(self) -> list[Preset]:
        """Sorted by name; a file that is not a preset is skipped (see ``skipped``). When two files
        share a name, the first by file name wins."""
        presets: dict[str, Preset] = {}
        skipped = []
        for path in sorted(self.directory.glob("*.json")) if self.directory.is_dir() else ():
            try:
                preset = Preset.from_json(json_files.load(path, MAX_PRESET_BYTES))
            except (OSError, ValueError) as exc:  # JSONFileError, json and UTF-8 errors are ValueErrors too
                log.warning("skipped preset file %s: %s", path.name, exc)
                skipped.append(SkippedPreset(path, str(exc)))
                continue
            presets.setdefault(preset.name, preset)
        self.skipped = tuple(skipped)
        return sorted(presets.values(), key=lambda p: p.name.lower())

    def save(self, preset: Preset) -> Path:
        """Write ``preset``, replacing the file of a preset with the same name."""
        self.directory.mkdir(parents=True, exist_ok=True)
        Preset.from_json(preset.to_json())  # never write a file the next load would skip
        path = self._existing(preset.name) or self.directory / file_name(preset.name)
        if path.exists() and self._name_in(path) != preset.name:  # a slug clash, or a bad file: keep it
            stem, n = path.stem, 2
            while (path := self.directory / f"{stem}-{n}.json").exists():
                n += 1
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(preset.to_json(), indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(path)
        return path

    def _existing(self, name: str) -> Path | None:
        for path in sorted(self.directory.glob("*.json")):
            if self._name_in(path) == name:
                return path
        return None

    @staticmethod
    def _name_in(path: Path) -> str | None:
        try:
            raw = json_files.load(path, MAX_PRESET_BYTES)
        except (OSError, ValueError):
            return None
        return raw.get("name") if isinstance(raw, dict) else None


def describe_skipped(skipped: tuple[SkippedPreset, ...]) -> str:
    """One line for the window's notice; '' when every preset file loaded."""
    if not skipped:
        return ""
    names = ", ".join(s.path.name for s in skipped[:3]) + (f" and {len(skipped) - 3} more" if len(skipped) > 3 else "")
    return f"Skipped {len(skipped)} preset file{'s' if len(skipped) != 1 else ''} that could not be read: {names}. The log says why."
