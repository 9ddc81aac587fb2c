"""A real window (offscreen) started on a store with good and bad conversation files: the good
ones are listed, the bad ones are set aside with a visible, non-modal notice naming the backups,
and Delete never reaches outside the store."""
import json

import pytest
from PySide6.QtWidgets import QApplication, QDialog

from app.store.conversations import Conversation, ConversationStore
from engine.core.paths import data_dir


def _conversations_dir():
    return data_dir() / "conversations"  # TANDEM_HOME is per test (tests/conftest.py)


@pytest.fixture()
def open_window(qtbot, app_settings):
    """Start the real main window (no model) on whatever the test put in the store."""
    from app.shell.window import MainWindow

    made = []  # strong refs: a window collected unclosed would never stop its engine thread

    def open_():
        window = MainWindow(app_settings, autoload=False)
        made.append(window)
        qtbot.addWidget(window)
        window.show()
        qtbot.waitExposed(window)
        return window

    yield open_
    for window in made:
        window.close()


def _titles(window):
    return [window.chat.list.item(i).text() for i in range(window.chat.list.count())]


def test_bad_files_are_set_aside_with_a_notice_and_the_good_ones_listed(open_window):
    store = ConversationStore(_conversations_dir())
    for title in ("first good", "second good"):
        c = Conversation(title=title)
        c.messages += [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "stats": "1 tok/s"}]
        store.save(c)
    good = {"title": "t", "created": 1.0, "updated": 2.0, "messages": []}
    bad = {
        "norole": {**good, "messages": [{"content": "who said this?"}]},
        "notalist": {**good, "messages": "hello"},
        "badtime": {**good, "updated": "yesterday"},
    }
    for name, raw in bad.items():
        (store.directory / f"{name}.json").write_text(json.dumps({"id": name, **raw}))

    window = open_window()
    assert sorted(_titles(window)) == ["first good", "second good"]
    notice = window.storage_notice
    assert notice.isVisible()
    text = notice.text.text()
    assert "3 conversation files" in text and str(store.directory) in text
    backups = sorted(store.directory.glob("*.unreadable"))
    assert len(backups) == 3
    assert all(b.name in text for b in backups)
    assert not any(isinstance(w, QDialog) and w.isVisible() for w in QApplication.topLevelWidgets())
    window.chat.list.setCurrentRow(0)  # the app still works: a good chat opens
    assert "q" in window.chat.transcript.toPlainText()


def test_no_notice_when_every_file_is_good(open_window):
    ConversationStore(_conversations_dir()).save(Conversation(title="only good"))
    window = open_window()
    assert _titles(window) == ["only good"]
    assert not window.storage_notice.isVisible()


def test_delete_in_the_window_never_removes_a_file_outside_the_store(open_window):
    directory = _conversations_dir()
    directory.mkdir(parents=True)
    victim = directory.parent / "victim.json"
    victim.write_text("precious")
    planted = {"id": "../victim", "title": "planted", "created": 1.0, "updated": 2.0,
               "messages": [{"role": "user", "content": "hi"}]}
    (directory / "abc123.json").write_text(json.dumps(planted))
    window = open_window()
    assert _titles(window) == ["planted"]
    window.chat.list.setCurrentRow(0)
    window.chat.delete_button.click()
    assert victim.read_text() == "precious"
    assert not (directory / "abc123.json").exists()
