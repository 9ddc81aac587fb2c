"""Conversation files: atomic saves, unreadable files set aside, newest first."""
import os

import pytest

from app.conversations import Conversation, ConversationStore


def test_round_trip_newest_first(tmp_path):
    store = ConversationStore(tmp_path)
    a, b = Conversation(title="a"), Conversation(title="b")
    a.messages.append({"role": "user", "content": "héllo 🙂"})
    store.save(a)
    store.save(b)
    loaded = store.load_all()
    assert [c.title for c in loaded] == ["b", "a"]
    assert loaded[1].messages == a.messages
    assert loaded[1].chat_messages() == [{"role": "user", "content": "héllo 🙂"}]


def test_a_failed_save_leaves_the_old_file_whole(tmp_path, monkeypatch):
    store = ConversationStore(tmp_path)
    c = Conversation(title="kept")
    c.messages.append({"role": "user", "content": "first"})
    store.save(c)
    before = store.path(c.id).read_bytes()
    c.messages.append({"role": "assistant", "content": "second"})

    def crash(*args):
        raise OSError("disk pulled out")

    monkeypatch.setattr(os, "replace", crash)
    with pytest.raises(OSError):
        store.save(c)
    assert store.path(c.id).read_bytes() == before
    assert not list(tmp_path.glob(".tmp-*")), "the temp file was not cleaned up"


def test_unreadable_files_are_set_aside_not_deleted(tmp_path):
    store = ConversationStore(tmp_path)
    (tmp_path / "broken.json").write_text("{not json")
    store.save(Conversation(title="fine"))
    assert [c.title for c in store.load_all()] == ["fine"]
    assert (tmp_path / "broken.unreadable").read_text() == "{not json"
