"""The layer contract, checked mechanically: kernels <- engine <- app, and no Qt in the engine,
no torch/transformers at module level in the app (the window must appear before torch loads)."""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FORBIDDEN = {
    "kernels": {"engine", "app", "PySide6", "PyQt5", "PyQt6", "transformers"},
    "engine": {"app", "PySide6", "PyQt5", "PyQt6", "pyqtgraph"},
    "app": {"torch", "transformers", "kernels"},
}


def imports(path: Path, module_level_only: bool):
    tree = ast.parse(path.read_text())
    nodes = tree.body if module_level_only else list(ast.walk(tree))
    for node in nodes:
        if isinstance(node, ast.Import):
            yield from (alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module.split(".")[0]


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_layer_imports(package):
    files = list((ROOT / package).rglob("*.py"))
    assert files, f"{package}/ has no modules"
    bad = []
    for path in files:
        # The app may import the engine lazily inside functions (on the worker thread only).
        for name in imports(path, module_level_only=package == "app"):
            if name in FORBIDDEN[package]:
                bad.append(f"{path.relative_to(ROOT)} imports {name}")
    assert not bad, "\n".join(bad)


def test_import_linter_contracts_hold():
    """pyproject.toml's import-linter contracts: the one-way layers across and inside engine/."""
    import shutil
    import subprocess
    import sys

    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe, "import-linter is a test dependency (pip install -e '.[test]')"
    out = subprocess.run([exe, "--no-cache"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout


# One upward import for each contract that keeps a floor plan: the contract must name it. (A
# contract that nothing can break would hold whatever the code did.)
UPWARD = [
    ("engine/models/planning/fit.py", "import torch", "no torch, no transformers"),
    ("engine/models/runners/kv_buffers.py", "from engine.models.loading import loader", "loading over runners over planning"),
    ("app/store/presets.py", "from app.bridge import jobs", "the app by concern"),
    ("app/chat/chat_widgets.py", "from app.demo import plots", "the app by concern"),
    ("app/bridge/remote_jobs.py", "from app.bridge import jobs", "the bridge's jobs over the worker"),
]


@pytest.mark.parametrize("module, line, contract", UPWARD, ids=[u[0] for u in UPWARD])
def test_an_upward_import_breaks_its_contract(tmp_path, module, line, contract):
    import os
    import shutil
    import subprocess
    import sys

    for package in ("app", "engine", "kernels"):
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    with open(tmp_path / module, "a") as f:
        f.write(f"\n{line}\n")
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([exe, "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode != 0
    listing = " ".join(out.stdout.split())  # the report wraps long contract names
    verdict = re.search(re.escape(contract) + r".*?\b(KEPT|BROKEN)\b", listing)
    assert verdict is not None and verdict.group(1) == "BROKEN", out.stdout[-3000:]
