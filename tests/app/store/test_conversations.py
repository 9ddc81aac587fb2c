"""Conversation files: atomic saves, newest first, and nothing on disk can hurt the user's data:
ids never become paths, a malformed file is set aside (never deleted) while the rest load, and
temporaries a killed save left behind are cleaned once they are stale."""
import json
import logging
import os
import time

import pytest

from app.store.conversations import (
    STALE_TEMPORARY_S,
    Conversation,
    ConversationStore,
    InvalidConversationId,
    describe_set_aside,
)


def _write(path, data):
    path.write_text(json.dumps(data) if not isinstance(data, str) else data, encoding="utf-8")


def _good(title="fine", **extra):
    return {"id": "x", "title": title, "created": 1.0, "updated": 2.0,
            "messages": [{"role": "user", "content": "hi"}], **extra}


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
    assert store.set_aside == ()


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


# --- ids never become paths -----------------------------------------------------------------

def test_an_id_inside_a_file_never_becomes_a_path(tmp_path):
    """A file claiming "id": "../victim" must not make Delete remove a file outside the store."""
    store_dir = tmp_path / "store"
    victim = tmp_path / "victim.json"
    victim.write_text("precious")
    store = ConversationStore(store_dir)
    _write(store_dir / "abc123.json", {**_good("planted"), "id": "../victim"})
    [loaded] = store.load_all()
    assert loaded.id == "abc123"  # the file name is the id; the content's disagreeing id is ignored
    store.delete(loaded.id)
    assert victim.read_text() == "precious"
    assert not (store_dir / "abc123.json").exists()


@pytest.mark.parametrize("bad_id", ["../victim", "..", ".", "", "a/b", "a\\b", "/etc/passwd", "x" * 65,
                                    "con", "NUL", "lpt1", "a b", "é", "-rf", ".tmp-abc"])
def test_unsafe_ids_are_refused_by_path_and_delete(tmp_path, bad_id):
    store = ConversationStore(tmp_path / "store")
    outside = tmp_path / "victim.json"
    outside.write_text("precious")
    with pytest.raises(InvalidConversationId):
        store.path(bad_id)
    with pytest.raises(InvalidConversationId):
        store.delete(bad_id)
    with pytest.raises(InvalidConversationId):
        store.save(Conversation(id=bad_id))
    assert outside.read_text() == "precious"


def test_a_symlink_out_of_the_store_is_refused(tmp_path):
    """Defence in depth: even a valid id must resolve to a path inside the store."""
    store = ConversationStore(tmp_path / "store")
    outside = tmp_path / "victim.json"
    outside.write_text("precious")
    (tmp_path / "store" / "link.json").symlink_to(outside)
    assert store.load_all() == []  # a link is not a conversation: not loaded, not renamed
    with pytest.raises(InvalidConversationId):
        store.delete("link")
    assert outside.read_text() == "precious"


def test_a_file_name_that_is_not_an_id_is_set_aside(tmp_path):
    store = ConversationStore(tmp_path)
    _write(tmp_path / "my chat.json", _good())
    assert store.load_all() == []
    [aside] = store.set_aside
    assert "file name" in aside.reason
    assert aside.backup.exists() and not (tmp_path / "my chat.json").exists()


# --- one malformed file never stops the app -------------------------------------------------

MALFORMED = {
    "not json": "{not json",
    "not an object": "[1, 2]",
    "not utf-8": b"\xff\xfe{}",
    "message without role": _good(messages=[{"content": "hi"}]),
    "unknown role": _good(messages=[{"role": "robot", "content": "hi"}]),
    "content not a string": _good(messages=[{"role": "user", "content": 3}]),
    "message not an object": _good(messages=["hi"]),
    "messages not a list": _good(messages={"role": "user", "content": "hi"}),
    "updated not a number": _good(updated="yesterday"),
    "updated a boolean": _good(updated=True),
    "created not finite": '{"title": "t", "created": NaN, "updated": 1, "messages": []}',
    "title not a string": _good(title=None),
    "title missing": {k: v for k, v in _good().items() if k != "title"},
    "stats not a string": _good(messages=[{"role": "assistant", "content": "x", "stats": 5}]),
    "id not a string": _good(id=7),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_a_malformed_file_is_set_aside_and_the_rest_load(tmp_path, caplog, case):
    store = ConversationStore(tmp_path)
    good = Conversation(title="fine")
    good.messages.append({"role": "user", "content": "hello"})
    store.save(good)
    bad = tmp_path / "broken.json"
    raw = MALFORMED[case]
    bad.write_bytes(raw if isinstance(raw, bytes) else (raw if isinstance(raw, str) else json.dumps(raw)).encode())
    original = bad.read_bytes()
    with caplog.at_level(logging.WARNING, logger="app.store.conversations"):
        loaded = store.load_all()
    assert [c.title for c in loaded] == ["fine"]
    [aside] = store.set_aside
    assert aside.original == bad and not bad.exists()
    assert aside.backup.parent == tmp_path and aside.backup.suffix == ".unreadable"
    assert aside.backup.read_bytes() == original, "the bad file must be kept byte for byte"
    assert aside.reason and aside.reason in caplog.text and "broken.json" in caplog.text
    assert [c.title for c in ConversationStore(tmp_path).load_all()] == ["fine"]  # and stays aside


def test_the_reason_names_the_bad_field(tmp_path):
    store = ConversationStore(tmp_path)
    _write(tmp_path / "broken.json", _good(messages=[{"role": "user", "content": "ok"}, {"content": "no role"}]))
    store.load_all()
    assert "messages.1.role" in store.set_aside[0].reason


def test_a_second_bad_copy_never_overwrites_the_first_backup(tmp_path):
    store = ConversationStore(tmp_path)
    _write(tmp_path / "broken.json", "first bad copy")
    store.load_all()
    _write(tmp_path / "broken.json", "second bad copy")
    store.load_all()
    _write(tmp_path / "broken.json", "third bad copy")
    store.load_all()
    backups = sorted(p.read_text() for p in tmp_path.glob("broken*.unreadable"))
    assert backups == ["first bad copy", "second bad copy", "third bad copy"]


def test_unknown_fields_are_kept_for_newer_versions(tmp_path):
    """A file from a newer Tandem (extra fields) loads, and saving it again keeps those fields."""
    store = ConversationStore(tmp_path)
    raw = _good(pinned=True, messages=[{"role": "user", "content": "hi", "tokens": 3}])
    raw["id"] = "newer1"
    _write(tmp_path / "newer1.json", raw)
    [c] = store.load_all()
    assert store.set_aside == ()
    store.save(c)
    saved = json.loads((tmp_path / "newer1.json").read_text())
    assert saved["pinned"] is True and saved["messages"][0]["tokens"] == 3


def test_the_schema_checks_every_field_of_a_conversation():
    from dataclasses import fields

    from engine.session.conversation_schema import ConversationSchema

    assert set(ConversationSchema.model_fields) == {f.name for f in fields(Conversation)} - {"extra"}


def test_save_refuses_what_load_would_set_aside(tmp_path):
    store = ConversationStore(tmp_path)
    c = Conversation(title="x", messages=[{"role": "user", "content": None}])
    with pytest.raises(ValueError):
        store.save(c)
    assert not list(tmp_path.iterdir())


def test_the_notice_names_how_many_and_where(tmp_path):
    store = ConversationStore(tmp_path)
    for name in ("a", "b"):
        _write(tmp_path / f"{name}.json", "{")
    store.load_all()
    text = describe_set_aside(store.set_aside)
    assert "2 conversation files" in text and str(tmp_path) in text
    assert all(a.backup.name in text for a in store.set_aside)
    assert describe_set_aside(()) == ""


# --- temporaries of killed saves ------------------------------------------------------------

def test_stale_temporaries_are_removed_fresh_ones_kept(tmp_path):
    store = ConversationStore(tmp_path)
    store.save(Conversation(title="real"))
    stale, fresh = tmp_path / ".tmp-k1ll3d_x.json", tmp_path / ".tmp-s4v1ng.json"
    stale.write_text('{"title": "half')
    fresh.write_text('{"title": "being written')
    old = time.time() - STALE_TEMPORARY_S - 60
    os.utime(stale, (old, old))
    other = tmp_path / ".hidden-notes.json"  # not ours by name: left alone, however old
    other.write_text("keep")
    os.utime(other, (old, old))
    loaded = store.load_all()
    assert [c.title for c in loaded] == ["real"]
    assert not stale.exists(), "a stale temporary of a killed save must be cleaned"
    assert fresh.exists(), "a second instance's save in progress must never be removed"
    assert other.exists()
    assert store.set_aside == ()


def test_temporaries_are_never_listed_as_conversations(tmp_path):
    store = ConversationStore(tmp_path)
    _write(tmp_path / ".tmp-abcdef12.json", {**_good("ghost"), "id": "ghost"})
    assert store.load_all() == [] and store.set_aside == ()
