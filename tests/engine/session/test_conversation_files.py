"""The walk over a conversation folder that the app's store and `tandem distill` share."""
import json
import os

from engine.core.bounded_json import JSONFileError
from engine.session.conversation_files import NotARegularFile, is_valid_id, read_conversation_files
from engine.session.conversation_schema import SchemaError

CONVERSATION = {"id": "c1", "title": "t", "created": 1.0, "updated": 2.0,
                "messages": [{"role": "user", "content": "hi"}]}


def test_each_file_is_read_or_refused_with_its_reason(tmp_path):
    (tmp_path / "c1.json").write_text(json.dumps(CONVERSATION))
    (tmp_path / "bad-role.json").write_text(json.dumps({**CONVERSATION, "messages": [{"role": "wizard", "content": ""}]}))
    (tmp_path / "deep.json").write_text("[" * 1000 + "]" * 1000)
    (tmp_path / "my chat.json").write_text(json.dumps(CONVERSATION))
    (tmp_path / "folder.json").mkdir()
    os.symlink(tmp_path / "c1.json", tmp_path / "link.json")
    (tmp_path / ".tmp-abc.json").write_text(json.dumps(CONVERSATION))  # a save in progress
    (tmp_path / "notes.txt").write_text("not ours")

    found = {f.path.name: f for f in read_conversation_files(tmp_path)}

    assert sorted(found) == ["bad-role.json", "c1.json", "deep.json", "folder.json", "link.json", "my chat.json"]
    assert found["c1.json"].raw["messages"][0]["content"] == "hi" and found["c1.json"].error is None
    assert isinstance(found["bad-role.json"].error, SchemaError)
    assert isinstance(found["deep.json"].error, JSONFileError)
    assert isinstance(found["my chat.json"].error, SchemaError)  # the name is the id, and this is none
    assert isinstance(found["folder.json"].error, NotARegularFile)
    assert isinstance(found["link.json"].error, NotARegularFile)
    assert all(f.raw is None for name, f in found.items() if name != "c1.json")


def test_ids_are_safe_file_names():
    assert is_valid_id("3f2a9c0e11ab") and is_valid_id("my-chat_2")
    assert not any(is_valid_id(x) for x in ("", "../x", "a.b", "-a", "con", "LPT1", "a" * 65, 7, None))
