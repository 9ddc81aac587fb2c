"""A conversation, preset or import file that is deeply nested, huge, or not a file at all is a
damaged file like any other: set aside (or skipped) with the usual notice while the rest load, and
the app starts. Python's json recurses once per level, so 100,000 '[' raised RecursionError, which
no "set a bad file aside" handler caught; a device or FIFO named like a preset was read forever."""
import json
import os

import pytest

from app.store.app_settings import Key
from app.store.conversation_io import MAX_IMPORT_BYTES, from_json, read_import
from app.store.conversations import Conversation, ConversationStore
from app.store.presets import PresetStore, describe_skipped
from engine.core.paths import data_dir

DEEP = 100_000
NESTS = {
    "list": "[" * DEEP + "]" * DEEP,
    "dict": '{"a":' * DEEP + "1" + "}" * DEEP,
    "in-a-field": '{"title": "t", "created": 1, "updated": 2, "messages": [], "x": ' + "[" * DEEP + "]" * DEEP + "}",
}
OVER_CAP = 64 * 2**20 + 1  # one byte over the 64 MiB a conversation file may be


def _saved_good(store):
    good = Conversation(title="fine")
    good.messages += [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]
    store.save(good)
    return good


@pytest.mark.parametrize("nest", sorted(NESTS))
def test_a_deeply_nested_conversation_is_set_aside_and_the_rest_load(tmp_path, nest):
    store = ConversationStore(tmp_path)
    _saved_good(store)
    (tmp_path / "deep.json").write_text(NESTS[nest])
    assert [c.title for c in store.load_all()] == ["fine"]
    [aside] = store.set_aside
    assert aside.backup.read_text() == NESTS[nest]  # kept byte for byte, never deleted
    assert "deep" in aside.reason


def test_brackets_inside_strings_and_an_ordinary_nest_still_load(tmp_path):
    store = ConversationStore(tmp_path)
    chat = Conversation(title="brackets")
    chat.messages.append({"role": "user", "content": "[" * DEEP + "{" * DEEP + '"\\"['})
    chat.extra["newer"] = json.loads("[" * 30 + "]" * 30)  # a newer version's field, nested a little
    store.save(chat)
    assert store.load_all() == [chat] and store.set_aside == ()


def test_an_oversized_conversation_file_is_set_aside_unread(tmp_path):
    store = ConversationStore(tmp_path)
    _saved_good(store)
    with open(tmp_path / "huge.json", "wb") as f:
        f.truncate(OVER_CAP)  # sparse: no disk used
    assert [c.title for c in store.load_all()] == ["fine"]
    [aside] = store.set_aside
    assert "64 MiB" in aside.reason and aside.backup.stat().st_size == OVER_CAP


@pytest.mark.timeout(60)  # a FIFO opened for reading blocks until a writer comes: never, here
def test_an_import_of_a_deep_huge_or_special_file_is_refused_with_a_reason(tmp_path):
    for text in NESTS.values():
        with pytest.raises(ValueError, match="deep"):
            from_json(text)
    deep = tmp_path / "deep.json"
    deep.write_text(NESTS["list"])
    with pytest.raises(ValueError, match="deep"):
        read_import(deep)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate(MAX_IMPORT_BYTES + 1)
    with pytest.raises(ValueError, match="MiB"):
        read_import(huge)
    os.mkfifo(tmp_path / "fifo.json")
    with pytest.raises(ValueError, match="not a regular file"):
        read_import(tmp_path / "fifo.json")


@pytest.mark.timeout(60)  # a FIFO opened for reading blocks until a writer comes: never, here
def test_deep_huge_and_special_preset_files_are_skipped_and_the_rest_load(tmp_path):
    directory = tmp_path / "presets"
    directory.mkdir()
    (directory / "fine.json").write_text(json.dumps({"name": "Fine", "temperature": 0.3}))
    for nest, text in NESTS.items():
        (directory / f"deep-{nest}.json").write_text(text)
    with open(directory / "huge.json", "wb") as f:
        f.truncate(OVER_CAP)
    os.mkfifo(directory / "fifo.json")
    (directory / "zero.json").symlink_to("/dev/zero")
    store = PresetStore(directory)
    assert [p.name for p in store.load_all()] == ["Fine"]
    reasons = {s.path.name: s.reason for s in store.skipped}
    assert set(reasons) == {"deep-dict.json", "deep-list.json", "deep-in-a-field.json", "huge.json", "fifo.json", "zero.json"}
    assert all("deep" in reasons[f"deep-{nest}.json"] for nest in NESTS)
    assert "not a regular file" in reasons["fifo.json"] and "not a regular file" in reasons["zero.json"]
    assert "MiB" in reasons["huge.json"]
    assert "6 preset files" in describe_skipped(store.skipped)
    assert (directory / "deep-list.json").read_text() == NESTS["list"]  # never rewritten
    store.save(store.load_all()[0])  # saving looks through every file for the same name: no crash


def test_the_window_starts_on_deep_files_names_them_and_lists_the_rest(qtbot, app_settings):
    from app.shell.window import MainWindow

    store = ConversationStore(data_dir() / "conversations")  # TANDEM_HOME is per test
    _saved_good(store)
    (store.directory / "deep.json").write_text(NESTS["list"])
    presets = data_dir() / "presets"
    presets.mkdir(parents=True)
    (presets / "deep.json").write_text(NESTS["dict"])
    app_settings.set(Key.CHAT_SETTINGS, NESTS["list"])  # the settings panel's last values
    window = MainWindow(app_settings, autoload=False)
    qtbot.addWidget(window)
    window.show()
    try:
        assert [window.chat.list.item(i).text() for i in range(window.chat.list.count())] == ["fine"]
        text = window.storage_notice.text.text()
        assert window.storage_notice.isVisible()
        assert "1 conversation file could not be read" in text and "deep.json" in text
        [backup] = store.directory.glob("deep.*.unreadable")
        assert backup.name in text and backup.read_text() == NESTS["list"]
    finally:
        window.close()
