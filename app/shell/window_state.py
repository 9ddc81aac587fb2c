"""What the main window remembers across restarts (QSettings behind app_settings.Key)."""
from __future__ import annotations

from PySide6.QtWidgets import QSplitter

from app.store.app_settings import Key
from engine.core.settings import PRECISION_ALIASES


def restore(window) -> None:
    """Size, tab, splitters, unsent text and the demo's controls as the window was closed."""
    s, c = window.settings, window.demo.controls
    geometry = s.get(Key.GEOMETRY)
    if geometry is not None:
        window.restoreGeometry(geometry)
    else:
        window.resize(1280, 860)
    # A first run opens on the picker, the recommended model selected, its one primary button.
    window.tabs.setCurrentIndex(s.get(Key.TAB, 0, int))
    for splitter, state in zip(window.findChildren(QSplitter), s.get(Key.SPLITTERS, []) or []):
        splitter.restoreState(bytes.fromhex(state))
    window.demo.prompt.setPlainText(s.get(Key.DEMO_PROMPT, "") or "")
    window.chat.input.setPlainText(s.get(Key.CHAT_DRAFT, "") or "")
    c.drafter.setCurrentIndex(max(0, c.drafter.findData(s.get(Key.DRAFTER, "model"))))
    c.draft_length.setValue(s.get(Key.DRAFT_LENGTH, 0, int))
    c.mode.setCurrentIndex(max(0, c.mode.findData(s.get(Key.MODE, "greedy"))))
    c.temperature.setValue(s.get(Key.TEMPERATURE, 0.7, float))
    c.top_p.setValue(s.get(Key.TOP_P, 0.95, float))
    saved = s.get(Key.PRECISION, "bf16")
    c.set_precision(PRECISION_ALIASES.get(saved, saved))  # saved under an older name
    c.max_new_tokens.setValue(s.get(Key.MAX_NEW_TOKENS, 128, int))
    window.models.set_context(s.get(Key.CONTEXT, 4096, int))
    window.models.set_app_precision(c.precision.currentData())
    window.speculation.update_state(choice=c.drafter_kind())
    window._tab_changed(window.tabs.currentIndex())

def save(window) -> None:
    """The counterpart of ``restore``, called on close."""
    s, c = window.settings, window.demo.controls
    s.set(Key.GEOMETRY, window.saveGeometry())
    s.set(Key.TAB, window.tabs.currentIndex())
    s.set(Key.SPLITTERS, [bytes(sp.saveState()).hex() for sp in window.findChildren(QSplitter)])
    s.set(Key.DEMO_PROMPT, window.demo.prompt.toPlainText())
    s.set(Key.CHAT_DRAFT, window.chat.input.toPlainText())
    s.set(Key.DRAFTER, c.drafter_kind())
    s.set(Key.DRAFT_LENGTH, c.draft_length.value())
    s.set(Key.MODE, c.mode.currentData())
    s.set(Key.TEMPERATURE, c.temperature.value())
    s.set(Key.TOP_P, c.top_p.value())
    s.set(Key.PRECISION, c.precision.currentData())
    s.set(Key.MAX_NEW_TOKENS, c.max_new_tokens.value())
    s.set(Key.CONTEXT, window.models.context.currentData())
    window.chat.save_state()
    if window.loaded is not None:
        s.set(Key.MODEL_TARGET, window.loaded.target_path)
        s.set(Key.MODEL_DRAFTER, window.loaded.drafter_path)
    s.sync()
