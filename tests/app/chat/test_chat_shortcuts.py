"""Keyboard: Enter / Ctrl+Enter to send (a setting), Shift+Enter a new line, Esc stops, Ctrl+N a
new chat and Ctrl+K the search box, from any tab."""
from PySide6.QtCore import Qt

from tests.app.conftest import wait_idle

CTRL, SHIFT = Qt.KeyboardModifier.ControlModifier, Qt.KeyboardModifier.ShiftModifier


def _type(qtbot, widget, text):
    widget.setFocus()
    qtbot.keyClicks(widget, text)


def test_enter_sends_and_shift_enter_makes_a_new_line(qtbot, make_window):
    window = make_window()
    window.tabs.setCurrentWidget(window.chat)
    chat = window.chat
    chat.panel.max_new_tokens.setValue(6)
    _type(qtbot, chat.input, "line one")
    qtbot.keyClick(chat.input, Qt.Key.Key_Return, SHIFT)
    qtbot.keyClicks(chat.input, "line two")
    assert chat.input.toPlainText() == "line one\nline two" and not chat.running
    qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    assert chat.running and chat.current.messages[0]["content"] == "line one\nline two"
    qtbot.waitUntil(lambda: not chat.running, timeout=120_000)
    wait_idle(qtbot, window)


def test_with_the_setting_ctrl_enter_sends_and_enter_makes_a_new_line(qtbot, make_window, app_settings):
    window = make_window()
    window.tabs.setCurrentWidget(window.chat)
    chat = window.chat
    chat.panel.max_new_tokens.setValue(6)
    chat.panel.ctrl_enter.setChecked(True)
    _type(qtbot, chat.input, "a")
    qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    qtbot.keyClicks(chat.input, "b")
    assert chat.input.toPlainText() == "a\nb" and not chat.running
    qtbot.keyClick(chat.input, Qt.Key.Key_Return, CTRL)
    assert chat.running
    qtbot.waitUntil(lambda: not chat.running, timeout=120_000)
    wait_idle(qtbot, window)
    window.close()
    again = make_window(settings=app_settings, load=False)
    assert again.chat.input.ctrl_enter_sends  # the setting is remembered


def test_escape_stops_generation(qtbot, make_window):
    window = make_window()
    window.tabs.setCurrentWidget(window.chat)
    chat = window.chat
    chat.panel.max_new_tokens.setValue(4000)
    _type(qtbot, chat.input, "a long story")
    qtbot.keyClick(chat.input, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: chat.streaming and len(chat.streaming["content"]) > 5, timeout=60_000)
    qtbot.keyClick(chat.input, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not chat.running, timeout=60_000)
    wait_idle(qtbot, window)
    assert "stopped" in chat.current.messages[-1]["stats"]


def test_ctrl_n_and_ctrl_k_work_from_another_tab(qtbot, make_window):
    window = make_window(load=False)
    chat = window.chat
    chat.current.messages.append({"role": "user", "content": "something"})
    window.tabs.setCurrentIndex(0)
    window.activateWindow()  # window shortcuts need the active window
    qtbot.waitUntil(window.isActiveWindow, timeout=2000)
    qtbot.keyClick(window.tabs, Qt.Key.Key_N, CTRL)
    assert window.tabs.currentWidget() is chat and chat.current.messages == [] and len(chat.conversations) == 2
    window.tabs.setCurrentIndex(1)
    qtbot.keyClick(window.tabs, Qt.Key.Key_K, CTRL)
    assert window.tabs.currentWidget() is chat
    qtbot.waitUntil(lambda: chat.search.hasFocus(), timeout=2000)
