"""Export to Markdown and JSON, import back: the round trip keeps everything."""
import json

import pytest

from app.store.conversation_io import FORMAT, export, from_json, to_json, to_markdown
from app.store.conversations import Conversation, ConversationStore


def _chats():
    a = Conversation(title="Adding", system_prompt="Answer in Python.", messages=[
        {"role": "user", "content": "add?"},
        {"role": "assistant", "content": "```python\ndef add(a, b):\n    return a + b\n```", "stats": "9.0 tok/s",
         "meta": {"tok_per_s": 9.0, "new_tokens": 12, "drafted": 10, "accepted": 8, "acceptance": 0.8,
                  "model": "tiny", "drafter": "tiny-draft", "precision": "fp32", "finish": "eos"}}])
    b = Conversation(title="Hello", messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}])
    return [a, b]


def test_json_export_then_import_equals_the_original(tmp_path):
    chats = _chats()
    path = export(chats, tmp_path / "all.json")
    assert json.loads(path.read_text())["format"] == FORMAT
    back = from_json(path.read_text())
    assert back == chats  # ids, titles, times, messages with stats and meta, system prompt


def test_import_never_reuses_a_taken_id_and_the_store_accepts_it(tmp_path):
    chats = _chats()
    back = from_json(to_json(chats), taken_ids={chats[0].id})
    assert back[0].id != chats[0].id and back[1].id == chats[1].id
    assert [c.messages for c in back] == [c.messages for c in chats]
    store = ConversationStore(tmp_path)
    for c in back:
        store.save(c)
    assert sorted(c.title for c in store.load_all()) == ["Adding", "Hello"]


def test_a_single_conversation_file_imports_and_a_bad_one_is_refused(tmp_path):
    chat = _chats()[1]
    assert from_json(json.dumps(chat.to_json())) == [chat]
    bad = {"format": FORMAT, "version": 1, "conversations": [chat.to_json(), {"title": 3}]}
    with pytest.raises(ValueError, match="conversation 2"):
        from_json(json.dumps(bad))


def test_markdown_export_reads_as_a_transcript(tmp_path):
    text = export(_chats(), tmp_path / "all.md").read_text()
    assert text.startswith("# Adding\n") and "> Answer in Python." in text
    assert "## You\n\nadd?" in text and "    return a + b" in text and "# Hello" in text
    assert to_markdown(_chats()[1]).count("## ") == 2
