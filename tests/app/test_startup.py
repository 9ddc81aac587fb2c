"""Start-up: the window module loads without torch; --screenshot works end to end."""
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_window_modules_do_not_import_torch():
    code = (
        "import sys; import app.window, app.__main__, app.downloads, app.jobs; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_screenshot_of_a_demo_run(tmp_path, tiny_dirs):
    out = tmp_path / "shot.png"
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen", "TANDEM_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--screenshot", str(out), "--target", str(tiny_dirs[0]), "--drafter", str(tiny_dirs[1]),
         "--demo", "def add(a, b):", "--max-new-tokens", "24", "--precision", "exact", "--timeout", "300"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    from PySide6.QtGui import QImage

    image = QImage(str(out))
    assert image.width() >= 800 and image.height() >= 600
    log = (tmp_path / "home" / "log" / "tandem.log").read_text()
    assert "demo: speedup" in log and "identical True" in log


def test_a_scripted_demo_without_a_model_fails_fast_and_says_why(tmp_path):
    """`--demo ... --screenshot` with nothing installed must not wait for its timeout."""
    out = tmp_path / "shot.png"
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen", "TANDEM_HOME": str(tmp_path / "empty-home")}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--screenshot", str(out), "--demo", "hello", "--timeout", "600"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "No model is installed yet" in result.stderr
    assert out.exists()  # the screenshot shows the window saying so
