"""Conversation management in a real window: rename, search, delete with undo, export/import,
edit an earlier question, per-reply stats; older files still load."""
import json

from PySide6.QtCore import Qt

from app.store.conversations import Conversation
from engine.core.paths import data_dir
from tests.app.chat.test_chat import send
from tests.app.conftest import wait_idle


def _titles(chat):
    return [chat.list.item(i).text() for i in range(chat.list.count()) if not chat.list.item(i).isHidden()]


def _seed_chats(chat):
    for title, words in (("Sorting lists", "how do I sort a list?"), ("Weather", "is it raining?")):
        c = Conversation(title=title, messages=[{"role": "user", "content": words}, {"role": "assistant", "content": "reply"}])
        chat.store.save(c)
    chat.conversations = chat.store.load_all()
    chat.current = None
    chat._fill_list()
    chat.list.setCurrentRow(0)


def test_an_old_file_without_the_new_fields_still_loads(qtbot, make_window):
    directory = data_dir() / "conversations"
    directory.mkdir(parents=True)
    old = {"id": "old1", "title": "old", "created": 1.0, "updated": 2.0,
           "messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", "stats": "1.0 tok/s"}]}
    (directory / "old1.json").write_text(json.dumps(old))
    window = make_window(load=False)
    restored = window.chat.conversations[0]
    assert restored.system_prompt == "" and restored.chat_messages()[0] == {"role": "user", "content": "q"}


def test_rename_and_search_by_title_and_content(qtbot, make_window):
    window = make_window(load=False)
    chat = window.chat
    _seed_chats(chat)
    weather = next(c for c in chat.conversations if c.title == "Weather")
    chat.list.setCurrentRow(chat.conversations.index(weather))
    chat.list.item(chat.conversations.index(weather)).setText("Rain today")  # as the inline editor does
    qtbot.waitUntil(lambda: weather.title == "Rain today")
    assert json.loads(chat.store.path(weather.id).read_text())["title"] == "Rain today"
    chat.search.setText("sort")  # a title
    assert _titles(chat) == ["Sorting lists"]
    chat.search.setText("RAINING")  # only in a message
    assert _titles(chat) == ["Rain today"]
    chat.search.clear()
    assert set(_titles(chat)) == {"Sorting lists", "Rain today"}


def test_delete_then_undo_restores_the_file_exactly(qtbot, make_window):
    window = make_window(load=False)
    chat = window.chat
    _seed_chats(chat)
    victim = chat.current
    path = chat.store.path(victim.id)
    before = path.read_bytes()
    chat.delete_button.click()
    assert not path.exists() and victim.title not in _titles(chat)
    assert not chat.undo_bar.isHidden() and "Deleted" in chat.undo_bar.text.text()
    chat.undo_bar.button.click()
    assert path.read_bytes() == before
    assert chat.current.id == victim.id and victim.title in _titles(chat) and chat.undo_bar.isHidden()


def test_the_undo_bar_goes_away_by_itself(qtbot, make_window):
    window = make_window(load=False)
    chat = window.chat
    _seed_chats(chat)
    chat.delete_button.click()
    chat.undo_bar.timer.setInterval(50)
    chat.undo_bar.timer.start()
    qtbot.waitUntil(lambda: chat.undo_bar.isHidden(), timeout=2000)
    assert chat.deleted is None  # nothing left to undo: the delete is final


def test_export_all_then_import_into_a_fresh_store(qtbot, make_window, tmp_path):
    window = make_window(load=False)
    chat = window.chat
    _seed_chats(chat)
    chat.current.system_prompt = "Be brief."
    chat.store.save(chat.current)
    originals = {c.title: c for c in chat.saved_conversations()}
    exported = chat.export(tmp_path / "chats.json", everything=True)
    chat.export(tmp_path / "one.md")
    assert (tmp_path / "one.md").read_text().startswith(f"# {chat.current.title}")
    for c in list(chat.conversations):
        chat.store.delete(c.id)
    chat.conversations, chat.current = [], None
    imported = chat.import_file(exported)
    assert {c.title for c in imported} == set(originals)
    for c in imported:
        o = originals[c.title]
        assert (c.messages, c.system_prompt, c.created) == (o.messages, o.system_prompt, o.created)
        assert chat.store.path(c.id).exists()


def test_edit_an_earlier_question_replaces_the_later_turns(qtbot, make_window):
    window = make_window()
    window.tabs.setCurrentWidget(window.chat)
    chat = window.chat
    chat.panel.max_new_tokens.setValue(8)
    send(qtbot, window, "first question")
    send(qtbot, window, "second question")
    assert len(chat.current.messages) == 4
    rect = chat.transcript.anchor_rect("edit:0")
    qtbot.mouseClick(chat.transcript.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert chat.editing == 0 and chat.input.toPlainText() == "first question" and not chat.edit_bar.isHidden()
    chat.input.setPlainText("a better first question")
    chat.send_button.click()
    qtbot.waitUntil(lambda: not chat.running, timeout=120_000)
    wait_idle(qtbot, window)
    messages = chat.current.messages
    assert [m["role"] for m in messages] == ["user", "assistant"] and messages[0]["content"] == "a better first question"
    assert json.loads(chat.store.path(chat.current.id).read_text())["messages"] == messages


def test_each_reply_keeps_its_stats_and_shows_them_on_hover(qtbot, make_window):
    window = make_window()
    window.tabs.setCurrentWidget(window.chat)
    chat = window.chat
    chat.panel.max_new_tokens.setValue(10)
    send(qtbot, window, "hello")
    meta = chat.current.messages[-1]["meta"]
    assert meta["model"] == window.loaded.target and meta["precision"] == "fp32"
    assert meta["new_tokens"] >= 1 and meta["tok_per_s"] > 0 and meta["drafter"]
    saved = json.loads(chat.store.path(chat.current.id).read_text())
    assert saved["messages"][-1]["meta"] == meta
    rect = chat.transcript.anchor_rect("stats:1")
    tip = chat.transcript.tooltip_at(rect.center())
    assert window.loaded.target in tip and "tok/s" in tip and "precision fp32" in tip
