"""Download from the picker against a Hub-compatible server on loopback, then load and run."""
import dataclasses

import pytest

from tests.app.conftest import run_demo, wait_idle
from tests.engine.hub.hub_server import FakeHub

TARGET, DRAFTER = "tandem-test/tiny-target", "tandem-test/tiny-drafter"


@pytest.fixture
def fake_hub(tiny_dirs, tmp_path, monkeypatch):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN", "HF_HUB_OFFLINE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    with FakeHub() as server:
        server.add_repo(TARGET, tiny_dirs[0])
        server.add_repo(DRAFTER, tiny_dirs[1])
        monkeypatch.setenv("HF_ENDPOINT", server.url)
        yield server


def tiny_entry():
    """A catalog entry like the real ones, pointing at the served tiny repos."""
    from engine.models.planning.catalog import find_entry

    base = find_entry("qwen2.5-coder-1.5b")
    return dataclasses.replace(base, id="tiny-test", name="Tiny test model", target_repo=TARGET, drafter_repo=DRAFTER,
                               drafter_kind="draft_model", gated=False)


def test_download_then_load_and_run(qtbot, make_window, fake_hub):
    from engine.models.planning.fit import assess
    from engine.models.planning.hardware import Hardware

    window = make_window(load=False)
    fit = assess(tiny_entry(), Hardware.from_profile({"ram_gb": 16, "disk_free_gb": 100}), "bf16", 2048)
    progress = []
    window.host.event.connect(lambda e: e.kind == "download" and progress.append(e.payload))
    window.download_entry(fit)
    assert window.state.value == "Downloading" and window.progress.isVisible()
    wait_idle(qtbot, window)
    assert not window.banner.isVisible(), window.banner.text.text()
    names = {type(p).__name__ for p in progress}
    assert {"DownloadStarted", "DownloadFinished"} <= names
    with qtbot.waitSignal(window.model_loaded, timeout=120_000) as loaded:
        window.load_entry(fit)
    assert loaded.args[0].drafter == "tiny-drafter" or loaded.args[0].drafter
    wait_idle(qtbot, window)
    run_demo(qtbot, window, max_new_tokens=12, draft_length=0)


def test_a_missing_repo_is_a_readable_error(qtbot, make_window, fake_hub):
    from engine.models.planning.fit import assess
    from engine.models.planning.hardware import Hardware

    window = make_window(load=False)
    entry = dataclasses.replace(tiny_entry(), target_repo="tandem-test/does-not-exist", drafter_repo=None, drafter_kind="lookup")
    window.download_entry(assess(entry, Hardware.from_profile({"ram_gb": 16}), "bf16", 2048))
    wait_idle(qtbot, window)
    assert window.banner.isVisible() and "does-not-exist" in window.banner.text.text()


def test_cancel_a_download(qtbot, make_window, fake_hub):
    from engine.models.planning.fit import assess
    from engine.models.planning.hardware import Hardware

    fake_hub.rate_bps = 20_000  # slow enough to cancel mid-file
    window = make_window(load=False)
    window.download_entry(assess(tiny_entry(), Hardware.from_profile({"ram_gb": 16}), "bf16", 2048))
    qtbot.waitUntil(lambda: "Downloading" in window.progress_detail.text() or window.progress.value() > 0, timeout=30_000)
    window.cancel_button.click()
    wait_idle(qtbot, window, timeout=10_000)
    assert not window.banner.isVisible()  # a cancel is not an error
    from engine.hub.download import is_installed

    assert is_installed(TARGET) is None
