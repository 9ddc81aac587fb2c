"""Files attached to a chat message, in a real window on the tiny pair: by the Attach button and by
a drop, a chip with the file's token count, a message too long for the context window refused
whole, PDFs read through pypdf, and attachments kept with the saved chat."""
import json
import os

import pytest
from PySide6.QtCore import QMimeData, QPointF, Qt, QUrl
from PySide6.QtGui import QDragEnterEvent, QDropEvent
from PySide6.QtWidgets import QApplication, QFileDialog

from app.store.attachments import MAX_TEXT_BYTES, Attachment, AttachmentError, block, read_attachment
from engine.session.saved_turns import user_content
from tests.app.conftest import wait_idle

CODE = '''def add(a, b):
    """Return the sum of a and b."""
    return a + b


def scale(values, factor):
    return [add(v, 0) * factor for v in values]
'''


def text_pdf(lines: list[str]) -> bytes:
    """A one-page PDF whose page shows ``lines`` in Helvetica (objects written by hand, xref exact)."""
    def esc(t):
        return t.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")
    content = ("BT /F1 12 Tf 72 720 Td 14 TL " + " ".join(f"({esc(line)}) Tj T*" for line in lines) + " ET").encode("latin-1")
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 4 0 R >> >> /Contents 5 0 R >>",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
        b"<< /Length %d >>\nstream\n" % len(content) + content + b"\nendstream",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for n, body in enumerate(objects, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref)
    return bytes(out)


# --- reading files --------------------------------------------------------------------------
def test_text_and_code_files_are_read_as_utf8(tmp_path):
    path = tmp_path / "calc.py"
    path.write_bytes(("\ufeff" + CODE.replace("\n", "\r\n") + "# é 🙂\n").encode("utf-8"))
    attachment = read_attachment(path)
    assert attachment.name == "calc.py" and attachment.kind == "text"
    assert attachment.text == CODE + "# é 🙂\n"  # BOM dropped, line ends \n
    assert block(attachment) == f"File: calc.py\n```python\n{CODE}# é 🙂\n```"


def test_a_fence_inside_the_file_cannot_close_its_block(tmp_path):
    path = tmp_path / "notes.md"
    path.write_text("# Notes\n```python\nx = 1\n```\n", encoding="utf-8")
    text = block(read_attachment(path))
    assert text.startswith("File: notes.md\n````markdown\n") and text.endswith("\n````")


@pytest.mark.parametrize("data, reason", [
    (b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is a binary file"),
    ("caf\xe9 latin-1".encode("latin-1"), "is not UTF-8 text (byte 3"),
])
def test_binary_and_undecodable_files_are_refused_with_a_reason(tmp_path, data, reason):
    path = tmp_path / "thing.dat"
    path.write_bytes(data)
    with pytest.raises(AttachmentError, match=r"thing\.dat " + reason.replace("(", r"\(")):
        read_attachment(path)


def test_a_file_over_the_cap_is_refused_before_it_is_read(tmp_path):
    path = tmp_path / "huge.log"
    with open(path, "wb") as f:
        f.truncate(MAX_TEXT_BYTES + 1)
    with pytest.raises(AttachmentError, match=r"huge\.log is 2,097,153 bytes: larger than the 2 MB a file may be"):
        read_attachment(path)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_only_regular_files_are_read_never_a_fifo_a_device_or_a_folder(tmp_path):
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)  # opening it for reading would block forever without O_NONBLOCK
    with pytest.raises(AttachmentError, match="pipe.txt is not a regular file"):
        read_attachment(fifo)
    if os.path.exists("/dev/zero"):
        with pytest.raises(AttachmentError, match="zero is not a regular file"):
            read_attachment("/dev/zero")
    with pytest.raises(AttachmentError, match="is a folder"):
        read_attachment(tmp_path)


def test_a_pdfs_text_is_extracted_and_one_without_text_says_so(tmp_path):
    pdf = tmp_path / "spec.pdf"
    pdf.write_bytes(text_pdf(["Tandem attachment spec", "Rename (carefully) foo to bar."]))
    attachment = read_attachment(pdf)
    assert attachment.kind == "pdf"
    assert attachment.text == "Tandem attachment spec\nRename (carefully) foo to bar."
    assert block(attachment).startswith("File: spec.pdf\n```\nTandem attachment spec")
    blank = tmp_path / "scan.pdf"
    blank.write_bytes(text_pdf([]))
    with pytest.raises(AttachmentError, match="scan.pdf has no text to extract"):
        read_attachment(blank)
    broken = tmp_path / "broken.pdf"
    broken.write_bytes(b"%PDF-1.4\nnot really")
    with pytest.raises(AttachmentError, match="broken.pdf is not a readable PDF"):
        read_attachment(broken)


def test_the_user_turn_puts_each_file_before_what_was_typed():
    files = [Attachment("a.py", "x = 1\n").to_json(), Attachment("b.txt", "hello").to_json()]
    assert user_content("rename x to y", files) == (
        "File: a.py\n```python\nx = 1\n```\n\nFile: b.txt\n```\nhello\n```\n\nrename x to y")
    assert user_content("plain", []) == "plain"


# --- in the window ----------------------------------------------------------------------------
def tokens_of(tiny_dirs, attachment: Attachment) -> int:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tiny_dirs[0]))
    return len(tokenizer(block(attachment), add_special_tokens=False)["input_ids"])


def chips_read(qtbot, chat, n):
    qtbot.waitUntil(lambda: len(chat.attached) == n and all(a is not None and a.tokens is not None
                                                            for a in chat.attached.values()), timeout=60_000)
    return [chat.attachments.chips[k].label.text() for k in chat.attached]


def test_attach_by_button_shows_a_chip_with_the_token_count(qtbot, make_window, tiny_dirs, tmp_path, monkeypatch):
    window = make_window()
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    path = tmp_path / "calc.py"
    path.write_text(CODE, encoding="utf-8")
    asked = []
    monkeypatch.setattr(QFileDialog, "getOpenFileNames", lambda *a, **k: (asked.append(a), ([str(path)], ""))[1])
    chat.attach_button.click()
    assert asked  # the button opened the file dialog
    assert chat.attachments.isVisible() and "calc.py" in chat.attachments.chips[next(iter(chat.attached))].label.text()
    (label,) = chips_read(qtbot, chat, 1)
    expected = tokens_of(tiny_dirs, Attachment("calc.py", CODE))
    assert label == f"calc.py · {expected:,} tokens"
    # ✕ removes it
    chip = next(iter(chat.attachments.chips.values()))
    chip.close_button.click()
    assert not chat.attached and chat.attachments.isHidden()


def drop_files(widget, paths):
    mime = QMimeData()
    mime.setUrls([QUrl.fromLocalFile(str(p)) for p in paths])
    pos = QPointF(widget.rect().center())
    enter = QDragEnterEvent(pos.toPoint(), Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, enter)
    drop = QDropEvent(pos, Qt.DropAction.CopyAction, mime, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier)
    QApplication.sendEvent(widget, drop)
    return enter.isAccepted(), drop.isAccepted()


def test_files_dropped_on_the_chat_or_the_message_box_are_attached(qtbot, make_window, tmp_path):
    window = make_window()
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    a, b, c = tmp_path / "a.py", tmp_path / "b.md", tmp_path / "c.pdf"
    a.write_text("print('a')\n", encoding="utf-8")
    b.write_text("# B\n", encoding="utf-8")
    c.write_bytes(text_pdf(["Page text of c"]))
    assert drop_files(chat, [a, b]) == (True, True)
    # On the message box the files are attached, not typed in as file:// addresses.
    drop_files(chat.input.viewport(), [c])
    labels = chips_read(qtbot, chat, 3)
    assert [label.split(" · ")[0] for label in labels] == ["a.py", "b.md", "c.pdf"]
    assert chat.input.toPlainText() == ""
    assert [x.text for x in chat.attached.values()][2] == "Page text of c"


def test_a_file_that_cannot_be_attached_says_why_and_leaves_no_chip(qtbot, make_window, tmp_path):
    window = make_window()
    chat = window.chat
    binary = tmp_path / "photo.jpg"
    binary.write_bytes(b"\xff\xd8\xff\xe0\x00\x10JFIF\x00")
    chat.attach_files([str(binary)])
    qtbot.waitUntil(lambda: not chat.attached, timeout=60_000)
    assert not chat.notice.isHidden()
    assert chat.notice.text.text().startswith("Not attached: photo.jpg is a binary file")
    assert not chat.attachments.chips


def test_a_message_too_long_for_the_context_is_refused_whole_and_nothing_is_sent(qtbot, make_window, tmp_path):
    window = make_window()  # the tiny target's context window is 512 tokens
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    chat.panel.max_new_tokens.setValue(16)
    big = tmp_path / "big.py"
    big.write_text("".join(f"def function_{i}(x):\n    return x * {i}\n\n" for i in range(120)), encoding="utf-8")
    small = tmp_path / "small.py"
    small.write_text("x = 1\n", encoding="utf-8")
    chat.attach_files([str(small), str(big)])
    chips_read(qtbot, chat, 2)
    big_tokens = next(a.tokens for a in chat.attached.values() if a.name == "big.py")
    assert big_tokens > 512
    jobs = []
    window.host.event.connect(lambda e: e.kind == "chat" and jobs.append(e))
    chat.input.setPlainText("explain these")
    chat.send_button.click()
    qtbot.waitUntil(lambda: not chat.running, timeout=60_000)
    wait_idle(qtbot, window)
    notice = chat.notice.text.text()
    assert notice.startswith("Not sent:") and "512-token context window" in notice
    over = int(notice.split(" tokens over")[0].rsplit(" ", 1)[1].replace(",", ""))
    assert f"big.py ({big_tokens:,} tokens) is too large by {over:,} tokens" in notice
    assert not jobs and chat.current.messages == []  # nothing sent, nothing kept
    assert chat.input.toPlainText() == "explain these"  # the message and its files are back in the box
    assert [a.name for a in chat.attached.values()] == ["small.py", "big.py"]
    assert not any(chat.store.directory.glob("*.json"))  # nothing was saved either
    # Removing the big file makes it fit: sent with the small one.
    key = next(k for k, a in chat.attached.items() if a.name == "big.py")
    chat.attachments.chips[key].close_button.click()
    chat.send_button.click()
    qtbot.waitUntil(lambda: not chat.running and chat._has_reply(), timeout=120_000)
    assert [a["name"] for a in chat.current.messages[0]["attachments"]] == ["small.py"]
    assert jobs


def test_attachments_are_sent_in_the_user_turn_saved_and_kept_by_regenerate_and_edit(qtbot, make_window, app_settings, tmp_path):
    window = make_window()
    chat = window.chat
    window.tabs.setCurrentWidget(chat)
    chat.panel.max_new_tokens.setValue(8)
    code, pdf = tmp_path / "calc.py", tmp_path / "spec.pdf"
    code.write_text(CODE, encoding="utf-8")
    pdf.write_bytes(text_pdf(["Always return ints."]))
    chat.attach_files([str(code), str(pdf)])
    chips_read(qtbot, chat, 2)
    sent = []
    window.chat.send_requested.connect(lambda messages, *_: sent.append(messages))
    chat.input.setPlainText("rename add to plus")
    chat.send_button.click()
    qtbot.waitUntil(lambda: not chat.running and chat._has_reply(), timeout=120_000)
    wait_idle(qtbot, window)
    user = sent[0][-1]["content"]
    assert user == f"File: calc.py\n```python\n{CODE}```\n\nFile: spec.pdf\n```\nAlways return ints.\n```\n\nrename add to plus"
    message = chat.current.messages[0]
    assert message["content"] == "rename add to plus" and [a["name"] for a in message["attachments"]] == ["calc.py", "spec.pdf"]
    assert not chat.attached and chat.attachments.isHidden()  # the composer is empty again
    shown = chat.transcript.toPlainText()
    assert "calc.py · " in shown and "spec.pdf · " in shown and "rename add to plus" in shown
    assert chat.current.title == "rename add to plus"
    reply_meta = chat.current.messages[1]["meta"]
    assert reply_meta["prompt_tokens"] > sum(a["tokens"] for a in message["attachments"])

    chat.regenerate_button.click()
    qtbot.waitUntil(lambda: not chat.running and chat._has_reply(), timeout=120_000)
    wait_idle(qtbot, window)
    assert sent[1][-1]["content"] == user  # the files went again
    assert chat.current.messages[0]["attachments"] == message["attachments"]

    saved = json.loads((chat.store.directory / f"{chat.current.id}.json").read_text(encoding="utf-8"))
    assert [a["name"] for a in saved["messages"][0]["attachments"]] == ["calc.py", "spec.pdf"]
    window.close()

    again = make_window(settings=app_settings)
    chat = again.chat
    again.tabs.setCurrentWidget(chat)
    restored = chat.conversations[0]
    assert restored.messages[0]["attachments"] == message["attachments"]
    assert "calc.py · " in chat.transcript.toPlainText()
    assert restored.chat_messages()[-2]["content"] == user
    # Editing the question brings its files back into the composer; sending keeps them.
    chat.begin_edit(0)
    assert [a.name for a in chat.attached.values()] == ["calc.py", "spec.pdf"]
    assert chat.input.toPlainText() == "rename add to plus"
    chat.input.setPlainText("rename add to total")
    chat.panel.max_new_tokens.setValue(8)
    chat.send_button.click()
    qtbot.waitUntil(lambda: not chat.running and chat._has_reply(), timeout=120_000)
    wait_idle(qtbot, again)
    assert len(chat.current.messages) == 2
    assert chat.current.messages[0]["content"] == "rename add to total"
    assert [a["name"] for a in chat.current.messages[0]["attachments"]] == ["calc.py", "spec.pdf"]


def test_a_saved_chat_from_before_attachments_still_loads(make_window, app_settings, tmp_path):
    from app.store.conversations import ConversationStore
    from engine.core.paths import data_dir

    store = ConversationStore(data_dir() / "conversations")
    old = {"id": "old1", "title": "old chat", "created": 1.0, "updated": 2.0,
           "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello", "stats": "x"}]}
    (store.directory / "old1.json").write_text(json.dumps(old), encoding="utf-8")
    window = make_window(load=False)
    (conversation,) = [c for c in window.chat.conversations if c.id == "old1"]
    assert conversation.chat_messages() == [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]
    assert "hi" in window.chat.transcript.toPlainText()
