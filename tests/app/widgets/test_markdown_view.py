"""Replies render as Markdown in the transcript: tables, highlighted code, a Copy per block."""
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from app.widgets.markdown_view import code_blocks, render_markdown
from engine.core.events import Finished, RunStats, Tokens
from engine.session.side_by_side import LaneEvent

REPLY = """# Plan

Use `add` like this:

| name | kind | notes |
|------|------|-------|
| add  | func | pure  |

```python
def add(a, b):
    return a + b
```

- one
- two

```
second block
```
"""


def test_code_blocks_are_exactly_the_fenced_code():
    assert code_blocks(REPLY) == ["def add(a, b):\n    return a + b", "second block"]
    html = render_markdown(REPLY, 4)
    assert "href='copy:4:0'" in html and "href='copy:4:1'" in html
    assert "<h1>" in html and "<li>" in html and "<script" not in render_markdown("<script>x</script>")


def _show(window, reply):
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    chat.current.messages += [{"role": "user", "content": "how do I add?"}, {"role": "assistant", "content": reply, "stats": ""}]
    chat.render()
    return chat.transcript


def _cursor_at(document, text):
    cursor = document.find(text)
    assert not cursor.isNull(), text
    return cursor


def test_a_table_and_a_highlighted_code_block_are_rendered(qtbot, make_window):
    window = make_window(load=False)
    document = _show(window, REPLY).document()
    cell = _cursor_at(document, "pure")
    table = cell.currentTable()
    assert table is not None and table.columns() == 3 and table.rows() == 2
    keyword = _cursor_at(document, "def")
    name = _cursor_at(document, "return")
    plain_colour = _cursor_at(document, "Use").charFormat().foreground().color()
    assert keyword.charFormat().foreground().color() != plain_colour  # Pygments coloured it
    assert keyword.charFormat().fontFixedPitch() or "monospace" in keyword.charFormat().fontFamilies()[0]
    assert name.charFormat().fontWeight() > 400  # "return" is a bold keyword in Pygments' default style
    inline = document.find("add", _cursor_at(document, "Use"))
    assert inline.charFormat().background().color().name() == "#dde1e6"  # inline code


def test_clicking_copy_puts_exactly_the_code_on_the_clipboard(qtbot, make_window):
    window = make_window(load=False)
    transcript = _show(window, REPLY)
    QApplication.clipboard().clear()
    for block, code in enumerate(code_blocks(REPLY)):
        rect = transcript.anchor_rect(f"copy:1:{block}")
        assert rect is not None
        qtbot.mouseClick(transcript.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
        assert QApplication.clipboard().text() == code


def test_streaming_rerenders_only_the_reply_and_finishes_as_markdown(qtbot, make_window):
    window = make_window(load=False)
    chat = window.chat
    chat.ready = True
    chat.current.messages.append({"role": "user", "content": "first question"})
    chat.running, chat.streaming = True, {"role": "assistant", "content": ""}
    chat.render()
    first_block = chat.transcript.document().begin().text()
    for piece in (REPLY[i:i + 7] for i in range(0, len(REPLY), 7)):
        chat.on_lane_event(LaneEvent("chat", Tokens(piece, (1,), (False,), 0, 0, 1.0)))
    qtbot.waitUntil(lambda: "second block" in chat.transcript.toPlainText(), timeout=5000)
    assert chat.transcript.document().begin().text() == first_block
    shown = chat.transcript.toPlainText()
    assert "```" not in shown and "def add(a, b):\n    return a + b" in shown.replace("\u2029", "\n")
    chat.on_lane_event(LaneEvent("chat", Finished("eos", RunStats(new_tokens=3, tok_per_s=9.0), (), REPLY)))
    assert not chat.running and chat.current.messages[-1]["content"] == REPLY
    assert _cursor_at(chat.transcript.document(), "pure").currentTable().columns() == 3


def test_the_common_lexers_are_read_ahead_off_the_windows_thread():
    import threading

    from app.widgets import markdown_view

    markdown_view._highlighted.cache_clear()
    thread = markdown_view.warm_up_in_background()
    assert thread is not threading.current_thread()
    thread.join(60)
    assert markdown_view._highlighted.cache_info().hits == 0
    for language in markdown_view.COMMON_LANGUAGES:  # each one highlighted ahead, its lexer loaded
        markdown_view._highlighted("x", language)
    assert markdown_view._highlighted.cache_info().hits == len(markdown_view.COMMON_LANGUAGES)
