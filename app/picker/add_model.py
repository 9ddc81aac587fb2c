""""Add model file…": pick a .gguf with a file dialog and register it (engine.library, in place,
never copied); the picker then lists it with source "imported".

``add_model_file(window, path)`` is what the button and the File menu action end in (tests call
it with a path); the import runs on the worker (app.picker.local_models.import_file) and a refusal
reaches the window's error banner with the file and the reason.
"""
from __future__ import annotations

from pathlib import Path

from PySide6.QtWidgets import QFileDialog, QWidget

from app.picker.local_models import import_file, list_local

FILE_FILTER = "GGUF models (*.gguf);;All files (*)"


def choose_model_file(parent: QWidget | None, start: str = "") -> str | None:
    """The file the user picked, or None when the dialog was cancelled."""
    path, _ = QFileDialog.getOpenFileName(parent, "Add model file", start or str(Path.home()), FILE_FILTER)
    return path or None


def add_model_file(window, path: str | Path) -> bool:
    """Register ``path`` on the worker; False when the window is busy (its banner says so)."""
    return window._submit("import", import_file(str(path), window.models.context.currentData()))


def ask_and_add(window) -> None:
    path = choose_model_file(window)
    if path:
        add_model_file(window, path)


def install(window):
    """The File menu's "Add model file…" action and the picker's button, wired; the action."""
    menu = window.menuBar().addMenu("&File")
    action = menu.addAction("&Add model file…", lambda: ask_and_add(window))
    window.models.add_model_requested.connect(lambda: ask_and_add(window))
    return action


def list_local_models(window) -> None:
    """Queue a listing of the local models behind whatever runs (like the machine probe)."""
    window.host.submit("probe", list_local(window.models.context.currentData()))
