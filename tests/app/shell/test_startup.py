"""Start-up: the window module loads without torch; --screenshot works end to end."""
import subprocess
import sys

from tests.paths import REPO_ROOT as ROOT


def test_window_modules_do_not_import_torch():
    code = (
        "import sys; import app.shell.window, app.__main__, app.picker.downloads, app.bridge.jobs; "
        "bad = [m for m in ('torch', 'transformers') if m in sys.modules]; print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stdout + result.stderr


def test_screenshot_of_a_demo_run(tmp_path, tiny_dirs):
    out = tmp_path / "shot.png"
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen", "TANDEM_HOME": str(tmp_path / "home")}
    result = subprocess.run(
        [sys.executable, "-m", "app", "--screenshot", str(out), "--target", str(tiny_dirs[0]), "--drafter", str(tiny_dirs[1]),
         "--demo", "def add(a, b):", "--max-new-tokens", "24", "--precision", "fp32", "--timeout", "300"],
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


def test_a_gguf_target_on_the_command_line_runs_its_own_quantization(tmp_path):
    """`--target FILE.gguf` without --precision runs the file ("file": it has no other), with a
    .gguf drafter; --precision file says the same; a folder precision for it names the reason."""
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer, perturbed_copy

    tokenizer = build_tokenizer()
    target = build_model("qwen2", len(tokenizer), layers=2)
    target_path = write_gguf(target, tokenizer, tmp_path / "target-q8_0.gguf", "Q8_0")
    drafter_path = write_gguf(perturbed_copy(target, 0.005, seed=3), tokenizer, tmp_path / "drafter-q8_0.gguf", "Q8_0")
    env = {**__import__("os").environ, "QT_QPA_PLATFORM": "offscreen", "TANDEM_HOME": str(tmp_path / "home")}

    def shoot(*extra):
        return subprocess.run(
            [sys.executable, "-m", "app", "--screenshot", str(tmp_path / "shot.png"), "--target", str(target_path),
             "--drafter", str(drafter_path), "--demo", "def add(a, b):", "--max-new-tokens", "16", "--timeout", "300", *extra],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=400,
        )

    for extra in ((), ("--precision", "file")):
        result = shoot(*extra)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "identical True" in result.stderr and "from its own Q8_0 weights" in result.stderr
    refused = shoot("--precision", "int8")
    assert refused.returncode == 1
    assert "target-q8_0.gguf is a GGUF file: it runs at precision 'file'" in refused.stderr
