"""What the main window does as it opens: probe the machine, load what it loads by itself, and
list the GGUF models already on this machine (LM Studio's, llama.cpp's, Ollama's, imported).

All of it runs on the one engine worker, in the order it is asked for. The first load is asked
for only when the probe's report arrives, and a window that loads by itself asks for the
local-model scan (every file found, its header read and weighed: milliseconds on an empty
machine, 2.4 s for 8 GGUF files whose headers are not yet recorded) once the probe has ended,
behind that load: asked beside the probe, the scan would run ahead of the first load and delay
it. The listing comes second.
"""
from __future__ import annotations

from pathlib import Path

from app.bridge import jobs
from app.picker import add_model
from app.store.app_settings import Key


def begin(window) -> None:
    """The first probe, and the scan at once unless the window loads a model by itself; the
    code highlighter's lexers read ahead of the first reply (app/widgets/markdown_view.py)."""
    from app.widgets.markdown_view import warm_up_in_background

    warm_up_in_background()
    job = window.probe(list_models=not window.autoload)
    window.list_after_probe = job if window.autoload else None


def job_ended(window, job: int) -> None:
    """Ask for a held-back scan when the first probe's job ends: its report, handled just
    before, asked for the first load (when there was one to make), which the scan follows."""
    if job is not None and job == window.list_after_probe:
        window.list_after_probe = None
        add_model.list_local_models(window)


def load_last_or_default(window, default_ready: bool) -> None:
    """Reopen what the user had loaded last time; otherwise the bundled offline pair."""
    from engine.models.loading import default_pair

    target = window.settings.get(Key.MODEL_TARGET, "") or ""
    drafter = window.settings.get(Key.MODEL_DRAFTER, "") or ""
    precision = window.demo.controls.precision.currentData()
    if target and default_pair.is_default_target(target) and default_ready:
        window.load_default()  # at its own settings: the GGUF file, unless told otherwise
    elif target and (Path(target) / "config.json").exists():
        drafter = drafter if drafter and (Path(drafter) / "config.json").exists() else None
        window._submit("load", jobs.load_models(target, drafter, precision))
    elif default_ready:
        window.load_default()
    else:
        window.tabs.setCurrentIndex(0)
        offline = window.last_report.offline if window.last_report is not None else ""
        if offline:
            message = (f"No model is installed yet and there is no network ({offline}): Tandem cannot download one now. "
                       "Connect to the internet (or unset HF_HUB_OFFLINE) and press Download, or load a model folder "
                       "you already have with --target.")
            window.models.show_offline(message)
        else:
            message = "No model is installed yet: pick one on the Models tab and press Download."
        window.banner.show_error(message)
        window.no_model.emit(message)
