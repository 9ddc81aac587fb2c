"""The layer contract, checked mechanically: kernels <- engine <- app, and no Qt in the engine,
no torch/transformers at module level in the app (the window must appear before torch loads)."""
import ast
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
