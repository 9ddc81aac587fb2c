"""`tandem models` lists the GGUF files found on this machine beside the catalog: each row says
its variant, file size, source and path, and how it is drafted for (or why prompt lookup)."""
from __future__ import annotations

import json

from engine.cli import main as cli_main

from .conftest import place_lmstudio


def _rows(capsys, *args: str) -> list[dict]:
    assert cli_main(["models", "--json", *args]) == 0
    return json.loads(capsys.readouterr().out)["models"]


def test_local_files_are_rows_with_variant_size_source_and_drafter(ggufs, isolated_home, tmp_path, capsys):
    target = place_lmstudio(isolated_home, ggufs["target"], "someone", "Tiny-GGUF")
    place_lmstudio(isolated_home, ggufs["drafter"], "someone", "Tiny-Drafter-GGUF")
    other = ggufs["other_vocab"]
    assert cli_main(["import", str(other)]) == 0
    capsys.readouterr()
    local = {r["path"]: r for r in _rows(capsys) if r["source"] not in ("hub", "pypi")}
    found = local[str(target)]
    assert (found["source"], found["variant"], found["precision"]) == ("lmstudio", "Q4_0", "file")
    assert found["file_bytes"] == target.stat().st_size and found["estimate_bytes"]["total"] > found["file_bytes"]
    assert found["drafter"] == "someone/Tiny-Drafter-GGUF/tiny-drafter-Q8_0"
    imported = local[str(other)]
    assert imported["source"] == "imported" and imported["drafter"] is None
    assert "vocabulary" in {r["why"] for r in imported["refused_drafters"]}, imported["refused_drafters"]
    assert imported["drafting_reason"]
    # --no-local: the catalog alone; the human table names the files and their drafters.
    assert all(r["source"] in ("hub", "pypi") for r in _rows(capsys, "--no-local"))
    assert cli_main(["models"]) == 0
    table = capsys.readouterr().out
    assert "GGUF files on this machine" in table and "drafter: someone/Tiny-Drafter-GGUF/tiny-drafter-Q8_0" in table
    assert "imported" in table and "prompt lookup (" in table
