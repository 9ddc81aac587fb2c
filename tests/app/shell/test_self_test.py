"""`python -m app --self-test`: the check the packaged app runs on itself, here from source."""
import os
import subprocess
import sys

from tests.paths import REPO_ROOT as ROOT


def run_self_test(tmp_path, *extra):
    env = {
        **os.environ,
        "QT_QPA_PLATFORM": "offscreen",
        "TANDEM_HOME": str(tmp_path / "home"),
        # fp32 never uses the compiled bf16 kernel; skipping it keeps a fresh machine from
        # compiling it here (tests/kernels covers it).
        "TANDEM_NO_CPU_KERNELS": "1",
    }
    return subprocess.run([sys.executable, "-m", "app", "--self-test", *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_self_test_passes_and_writes_a_screenshot(tmp_path):
    out = tmp_path / "self-test.png"
    result = run_self_test(tmp_path, str(out))
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    assert "self-test: OK: plain and speculative outputs identical" in result.stdout
    # TANDEM_NO_CPU_KERNELS: every package reports its reference kernel.
    assert ("CPU kernels: bf16 linear reference, int8 linear reference, int4 linear reference, "
            "int8/int4 decoder layer reference, attention reference") in result.stdout
    from PySide6.QtGui import QImage

    image = QImage(str(out))
    assert image.width() >= 800 and image.height() >= 600
    log = (tmp_path / "home" / "log" / "tandem.log").read_text()
    assert "self-test: OK" in log
    # The user's own settings are never touched: the self-test keeps its own in a temp dir.
    assert not (tmp_path / "home" / "config" / "settings.ini").exists()

