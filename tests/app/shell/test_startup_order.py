"""Start-up order on the one engine worker: a window that loads a model by itself asks for that
load before the local-model scan (LM Studio's, llama.cpp's, Ollama's folders), so the scan never
delays it; the scan still lists the same models, after it."""
from __future__ import annotations

import pytest

from app.bridge.messages import JobEnded, ModelLoaded
from app.picker.local_models import LocalModels
from app.store.app_settings import Key
from tests.local_stores import isolate_local_stores

LMSTUDIO_NAME = "tiny-org/tiny-target-GGUF/tiny-target-Q8_0"


@pytest.fixture
def lmstudio_model(tmp_path, monkeypatch):
    """A tiny GGUF file in LM Studio's folder of an isolated home: the scan has one to find."""
    from engine.testing.tiny_gguf import build_model, write_gguf
    from engine.testing.tiny_models import build_tokenizer
    from tests.engine.library.conftest import place_lmstudio

    home = isolate_local_stores(tmp_path, monkeypatch)
    tokenizer = build_tokenizer()
    source = write_gguf(build_model("qwen2", len(tokenizer), layers=1), tokenizer, tmp_path / "tiny-target-Q8_0.gguf", "Q8_0")
    return place_lmstudio(home, source, "tiny-org", "tiny-target-GGUF")


def open_window(qtbot, app_settings, autoload: bool):
    """A real window, and every worker event it receives as (job id, kind, payload), in order."""
    from app.shell.window import MainWindow

    window = MainWindow(app_settings, autoload=autoload)
    qtbot.addWidget(window)
    seen: list = []
    window.host.event.connect(lambda envelope: seen.append((envelope.job, envelope.kind, envelope.payload)))
    window.show()
    return window, seen


def job_of(seen, payload_type) -> int:
    return next(job for job, _, payload in seen if isinstance(payload, payload_type))


def local_names(window) -> set[str]:
    return {local.model.name for local in window.models.local.values()}


def test_the_first_load_is_asked_for_before_the_local_model_scan(qtbot, app_settings, tiny_dirs, lmstudio_model):
    app_settings.set(Key.MODEL_TARGET, str(tiny_dirs[0]))  # what the user had loaded last time
    app_settings.set(Key.MODEL_DRAFTER, str(tiny_dirs[1]))
    window, seen = open_window(qtbot, app_settings, autoload=True)
    qtbot.waitUntil(lambda: any(isinstance(p, LocalModels) for _, _, p in seen), timeout=120_000)
    qtbot.waitUntil(lambda: window.active_job is None, timeout=120_000)
    load, scan = job_of(seen, ModelLoaded), job_of(seen, LocalModels)
    assert window.loaded is not None and window.loaded.target == tiny_dirs[0].name
    assert load < scan  # asked for first: the worker runs its jobs in that order
    order = [(job, type(p)) for job, _, p in seen if job in (load, scan)]
    # The load ran to its end before the scan began.
    assert order.index((load, JobEnded)) < order.index((scan, LocalModels))
    assert LMSTUDIO_NAME in local_names(window)  # the scan lists what it always did


def test_with_nothing_to_load_the_scan_still_lists_the_machines_models(qtbot, app_settings, lmstudio_model):
    window, seen = open_window(qtbot, app_settings, autoload=True)  # an empty home: no model to load
    qtbot.waitUntil(lambda: any(isinstance(p, LocalModels) for _, _, p in seen), timeout=120_000)
    assert not any(kind == "load" for _, kind, _ in seen)
    assert "No model is installed yet" in window.banner.text.text()
    assert LMSTUDIO_NAME in local_names(window)


def test_a_window_that_loads_nothing_by_itself_scans_at_once(qtbot, app_settings, lmstudio_model):
    window, seen = open_window(qtbot, app_settings, autoload=False)
    assert window.list_after_probe is None  # asked for beside the probe, as before
    qtbot.waitUntil(lambda: any(isinstance(p, LocalModels) for _, _, p in seen), timeout=120_000)
    assert LMSTUDIO_NAME in local_names(window)
