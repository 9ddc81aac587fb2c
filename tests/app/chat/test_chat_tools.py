"""The chat's tools: the MCP servers' settings and their dialog, tool turns in the conversation
file, in what the model reads and in the transcript, and the JSON reply format. The turn itself
on the real pair is tests/end_to_end/test_chat_tools_real_pair.py."""
import json

import pytest
from PySide6.QtCore import Qt

from app.chat.tools_dialog import COMMAND, NAME, ON, ToolsDialog
from app.store.app_settings import Key
from app.store.conversations import Conversation, ConversationStore
from app.store.presets import Preset
from app.store.tool_settings import BadToolSettings, McpEntry, ToolSettings, load_tool_settings, save_tool_settings
from engine.core.settings import InvalidRequest
from engine.session.chat import DECLINED, for_the_model
from engine.session.conversation_schema import validate

TOOL_TURNS = [
    {"role": "user", "content": "Weather in Lisbon?"},
    {"role": "assistant", "content": "", "tool_calls": [{"name": "weather", "arguments": '{"city": "Lisbon"}'}]},
    {"role": "tool", "name": "weather", "outcome": "ran", "content": '{"temperature": 21}'},
    {"role": "assistant", "content": "It is 21 degrees and clear."},
]


def test_servers_round_trip_through_the_settings_and_bad_ones_are_named(app_settings):
    tools = ToolSettings((McpEntry("files", "npx -y '@modelcontextprotocol/server-filesystem' '/home/me/my notes'"),
                          McpEntry("fetch", "uvx mcp-server-fetch", enabled=False)), confirm=True)
    save_tool_settings(app_settings, tools)
    again = load_tool_settings(app_settings)
    assert again == tools
    (config,) = again.configs()  # the disabled one is not started
    assert (config.name, config.command, config.args) == (
        "files", "npx", ("-y", "@modelcontextprotocol/server-filesystem", "/home/me/my notes"))
    for bad, words in [((McpEntry("a", "x"), McpEntry("a", "y")), "two servers are named 'a'"),
                       ((McpEntry("", "x"),), "needs a name"),
                       ((McpEntry("a", "  "),), "'a' has no command"),
                       ((McpEntry("a", "python -c 'unclosed"),), "cannot be read")]:
        with pytest.raises(BadToolSettings, match=words):
            ToolSettings(bad).check()


@pytest.mark.parametrize("saved", ["not json", "[]", '{"servers": [{"name": 3}]}', "[" * 100_000])
def test_saved_servers_that_are_not_valid_read_as_none(app_settings, saved):
    app_settings.set(Key.CHAT_TOOLS, saved)
    assert load_tool_settings(app_settings) == ToolSettings()


def test_the_dialog_adds_edits_and_refuses_what_it_cannot_save(qtbot):
    dialog = ToolsDialog(ToolSettings((McpEntry("one", "python -m one"),)))
    qtbot.addWidget(dialog)
    dialog.add_button.click()
    row = dialog.table.rowCount() - 1
    assert dialog.table.item(row, NAME).text() == "server 1"
    dialog.table.item(row, COMMAND).setText("python -m two --flag")
    dialog.table.item(0, ON).setCheckState(Qt.CheckState.Unchecked)
    dialog.confirm.setChecked(False)
    dialog.accept()
    assert dialog.result_settings == ToolSettings((McpEntry("one", "python -m one", enabled=False),
                                                   McpEntry("server 1", "python -m two --flag")), confirm=False)

    bad = ToolsDialog(ToolSettings())
    qtbot.addWidget(bad)
    bad.show()
    bad.add_button.click()  # no command typed
    bad.accept()
    assert bad.isVisible() and bad.result_settings is None and "has no command" in bad.error.text()


def test_tool_turns_are_saved_read_back_and_given_to_the_model_as_the_template_takes_them(tmp_path):
    store = ConversationStore(tmp_path)
    conversation = Conversation(messages=[dict(m) for m in TOOL_TURNS])
    store.save(conversation)
    (loaded,) = store.load_all()
    assert loaded.messages == TOOL_TURNS
    validate(loaded.to_json())
    turns = loaded.chat_messages()
    assert turns[1] == {"role": "assistant", "content": "", "tool_calls": [
        {"type": "function", "function": {"name": "weather", "arguments": {"city": "Lisbon"}}}]}
    assert turns[2] == {"role": "tool", "content": for_the_model('{"temperature": 21}')}  # what chat_with_tools gave it


def test_the_transcript_shows_each_call_and_its_result_not_the_raw_call(qtbot):
    from app.chat.chat_transcript import TOOL_RESULT_SHOWN, Transcript

    view = Transcript()
    qtbot.addWidget(view)
    flood = {"role": "tool", "name": "read_file", "outcome": "ran", "content": "x" * (TOOL_RESULT_SHOWN + 500)}
    declined = {"role": "tool", "name": "delete_all", "outcome": "declined", "content": DECLINED}
    view.render_turns(TOOL_TURNS + [flood, declined])
    text = view.toPlainText()
    assert "Calls the tool weather" in text and '"city": "Lisbon"' in text
    assert "Result of weather" in text and '{"temperature": 21}' in text
    assert "and 500 more characters, which the model read" in text
    assert "Not run (declined): delete_all" in text and DECLINED not in text
    assert "<tool_call>" not in text


def test_the_reply_format_becomes_the_engines_output_format(qtbot):
    assert Preset(name="p").decode_settings().output_format is None
    assert Preset(name="p", reply_format="json").decode_settings().output_format.kind == "json_object"
    schema = json.dumps({"type": "object", "properties": {"name": {"type": "string"}}})
    made = Preset(name="p", reply_format="json_schema", json_schema=schema).decode_settings().output_format
    assert (made.kind, made.schema) == ("json_schema", schema)
    for bad, words in [("", "no schema is given"), ("{not json", "not JSON")]:
        with pytest.raises(InvalidRequest, match=words):
            Preset(name="p", reply_format="json_schema", json_schema=bad).decode_settings()
    assert Preset.from_json(Preset(name="p", reply_format="json_schema", json_schema=schema).to_json()).json_schema == schema


def test_the_chat_refuses_to_send_with_a_schema_that_is_not_json(qtbot, tmp_path):
    from app.chat.chat_view import ChatView
    from app.store.presets import PresetStore

    view = ChatView(ConversationStore(tmp_path / "c"), PresetStore(tmp_path / "p"))
    qtbot.addWidget(view)
    view.set_ready(True)
    sent = []
    view.send_requested.connect(lambda *a: sent.append(a))
    panel = view.panel
    panel.reply_format.setCurrentIndex(panel.reply_format.findData("json_schema"))
    panel.json_schema.setPlainText("{not json")
    assert "not JSON" in panel.schema_problem.text()
    view.input.setPlainText("Describe a cat.")
    view.send()
    assert not sent and "not JSON" in view.notice.text.text() and view.input.toPlainText() == "Describe a cat."
    panel.json_schema.setPlainText('{"type": "object"}')
    assert panel.schema_problem.text() == ""
    view.send()
    (messages, settings, _drafter), = sent
    assert settings.output_format.kind == "json_schema" and messages[-1]["content"] == "Describe a cat."


def test_a_json_reply_cut_by_max_tokens_says_so(qtbot, tmp_path):
    from app.chat.chat_view import ChatView
    from app.store.presets import PresetStore
    from engine.core.events import Finished, RunStats
    from engine.session.side_by_side import LaneEvent

    view = ChatView(ConversationStore(tmp_path / "c"), PresetStore(tmp_path / "p"))
    qtbot.addWidget(view)
    view.set_ready(True)
    view.panel.reply_format.setCurrentIndex(view.panel.reply_format.findData("json"))
    for reason, told in (("eos", False), ("max_new_tokens", True)):
        view.notice.dismiss()
        view.input.setPlainText("Give me a record.")
        view.send()
        view.on_lane_event(LaneEvent("chat", Finished(reason, RunStats(new_tokens=3), (1, 2, 3), '{"a": ')))
        assert ("before its JSON was complete" in view.notice.text.text()) is told
