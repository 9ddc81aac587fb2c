"""The catalog's EAGLE-3 and DFlash pairs (resources/catalog.json, no test double for it) through
`tandem download`, from the loopback fake Hub: under the real repos' and files' names it serves a
tiny GGUF file as the target's variant and, as the drafter's repo, a tiny checkpoint in the
published layout (built by tests/engine/drafters/eagle3_checkpoints.py, which never imports the
engine's reader) made for that file's model. The target's GGUF variant and the drafter's whole
folder are fetched, and the pair loads and speculates with plain decoding's output."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.cli import main as cli_main
from engine.core.settings import DecodeSettings
from engine.drafters.dflash import DFlashDrafter
from engine.drafters.eagle3 import Eagle3Drafter
from engine.hub.download import is_installed
from engine.models.planning.catalog import find_entry
from engine.session.compare import compare
from engine.session.session import Session
from tests.engine.drafters import eagle3_checkpoints as checkpoints
from tests.engine.hub.hub_server import FakeHub
from tests.engine.hub.test_hub_gguf import point_hf_at

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("one_torch_thread")]
LAYERS = 4


def write_tiny_pair(root: Path) -> tuple[bytes, dict[str, Path]]:
    """A tiny target as a GGUF file's bytes, and an EAGLE-3 and a DFlash checkpoint made for it."""
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer

    root.mkdir(parents=True, exist_ok=True)
    tokenizer = build_tokenizer()
    model = build_model("qwen2", len(tokenizer), layers=LAYERS, seed=4)
    gguf = write_gguf(model, tokenizer, root / "target.gguf", "Q8_0").read_bytes()
    eagle3 = checkpoints.save_speculators(root / "eagle3", model, checkpoints.copy_of_target(model), [1, 2, LAYERS],
                                          verifier="Qwen/Qwen3-8B")
    dflash = checkpoints.save_dflash_authors(root / "dflash", model, [1, 2], mask_token_id=len(tokenizer) - 1)
    return gguf, {"eagle3": eagle3, "dflash": dflash}


@pytest.fixture(scope="module")
def tiny_pair_files(tmp_path_factory):
    return write_tiny_pair(tmp_path_factory.mktemp("made-for-target"))


def serve_pair(server: FakeHub, entry, gguf: bytes, drafter_folder: Path) -> None:
    variant = entry.variants[0]
    server.add_repo(variant.repo, extra={"README.md": b"# GGUF builds", **{name: gguf for name in variant.files}})
    server.add_repo(entry.drafter_repo, drafter_folder, extra={"README.md": b"# a drafter made for its target"})


@pytest.mark.parametrize("entry_id, drafter_type", [("qwen3-8b-eagle3", Eagle3Drafter), ("qwen3-8b-dflash", DFlashDrafter)])
def test_the_catalogs_pair_downloads_and_speculates_as_plain(tiny_pair_files, tmp_path, monkeypatch, capsys,
                                                              entry_id, drafter_type):
    entry = find_entry(entry_id)
    gguf, folders = tiny_pair_files
    point_hf_at(tmp_path, monkeypatch)
    with FakeHub() as server:
        serve_pair(server, entry, gguf, folders[entry.drafter_kind])
        monkeypatch.setenv("HF_ENDPOINT", server.url)

        assert cli_main(["download", entry_id]) == 0

        out, err = capsys.readouterr()
        assert f"({entry.drafter_kind}, catalog;" in err
        paths = dict(line.split(": ", 1) for line in out.strip().splitlines())
        target, drafter = Path(paths["target"]), Path(paths["drafter"])
        assert target.name == entry.variants[0].files[0]
        assert drafter == is_installed(entry.drafter_repo) and (drafter / "config.json").is_file()
        fetched = {(e.repo, e.path) for e in server.requests() if e.kind in ("cdn", "resolve") and e.status in (200, 206)}
        assert (entry.variants[0].repo, entry.variants[0].files[0]) in fetched
        assert {p for r, p in fetched if r == entry.drafter_repo} >= {"config.json", "model.safetensors"}

    session = Session.load(target, drafter, "file", "cpu")
    assert isinstance(session.drafter("model").model, drafter_type)  # inside prompt lookup's wrapper
    result = compare(session, "def add(a, b):", DecodeSettings(max_new_tokens=24, draft_length=3))
    assert result.speculative.token_ids == result.plain.token_ids and result.speculative.stats.drafted > 0


def test_a_drafter_repo_that_is_no_made_for_target_checkpoint_is_refused_before_its_weights(tiny_pair_files, tmp_path,
                                                                                           monkeypatch, capsys):
    entry = find_entry("qwen3-8b-eagle3")
    gguf, folders = tiny_pair_files
    plain = tmp_path / "plain-model"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps({"architectures": ["Qwen2ForCausalLM"], "vocab_size": 32}))
    (plain / "model.safetensors").write_bytes((folders["eagle3"] / "model.safetensors").read_bytes())
    point_hf_at(tmp_path, monkeypatch)
    with FakeHub() as server:
        serve_pair(server, entry, gguf, plain)
        monkeypatch.setenv("HF_ENDPOINT", server.url)

        assert cli_main(["download", entry.id]) == 1

        err = capsys.readouterr().err
        assert "is not an EAGLE-3 or DFlash drafter" in err, err
        weights = [e for e in server.requests() if e.repo == entry.drafter_repo and e.path == "model.safetensors"
                   and e.method == "GET" and e.status in (200, 206)]
        assert weights == []
