"""A reply or a saved chat never makes the transcript fetch anything: an image in Markdown (or a
raw <img>) shows as its alt text and its address, as text, and the view loads no resource at all,
whatever the address names (a device that never ends, a FIFO that never opens, a real picture).

Real offscreen windows, through the two paths a reply reaches the transcript: streamed in while
the model writes, and a saved chat opened at start-up. A FIFO with no writer would block the
render forever if anything opened it, inside Qt with the GIL held, where pytest-timeout's thread
cannot run: faulthandler's watchdog (a C thread) ends the run with every thread's traceback instead.
"""
import faulthandler
import os
import sys

import pytest
from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QImage, QTextDocument

from app.chat.chat_transcript import Transcript
from app.store.conversations import Conversation, ConversationStore
from app.widgets.markdown_view import render_markdown
from engine.core.events import Finished, RunStats, Tokens
from engine.core.paths import data_dir
from engine.session.side_by_side import LaneEvent

HANG_S = 120  # far beyond a render (well under a second here): only a blocked open reaches it
PROBES = ("dev-zero", "fifo", "picture", "raw-html")
RESOURCE_TYPES = (QTextDocument.ResourceType.HtmlResource, QTextDocument.ResourceType.ImageResource,
                  QTextDocument.ResourceType.StyleSheetResource, QTextDocument.ResourceType.MarkdownResource,
                  QTextDocument.ResourceType.UserResource)


def _probe(kind, tmp_path):
    """(reply text, the address it names, what must be shown instead of the image)."""
    if kind == "dev-zero":
        return "Look: ![a picture](/dev/zero) there.", "/dev/zero", "[image: a picture]"
    if kind == "fifo":
        fifo = tmp_path / "never-written"
        os.mkfifo(fifo)  # no writer: opening it for reading blocks
        return f"Look: ![a pipe]({fifo}) there.", str(fifo), "[image: a pipe]"
    picture = tmp_path / "secret.png"
    image = QImage(4, 4, QImage.Format.Format_RGB32)
    image.fill(0xFF0000)
    assert image.save(str(picture))
    if kind == "picture":
        return f"Look: ![a secret]({picture}) there.", str(picture), "[image: a secret]"
    return f'Look: <img src="{picture}"> there.', str(picture), f'<img src="{picture}">'


def _images(document):
    """The names of every image the document holds (in any frame or table)."""
    names, block = [], document.begin()
    while block.isValid():
        it = block.begin()
        while not it.atEnd():
            fmt = it.fragment().charFormat()
            if fmt.isImageFormat():
                names.append(fmt.toImageFormat().name())
            it += 1
        block = block.next()
    return names


def _show_chat(window):
    """The chat tab in front and its transcript painted: Qt fetches an image when it lays out and
    draws the document, so a hidden transcript would hide the defect."""
    window.tabs.setCurrentWidget(window.chat)
    window.chat.transcript.grab()
    return window.chat


def _read_nothing(resource):
    """What the transcript answers for a resource: nothing, or for an image a blank 1x1 one."""
    return resource is None or (isinstance(resource, QImage) and resource.size().width() == 1
                                and resource.size().height() == 1 and resource.pixel(0, 0) == 0)


def _assert_inert(transcript, address, shown):
    transcript.grab()
    text = transcript.toPlainText()
    assert shown in text and address in text
    assert _images(transcript.document()) == []
    for url in (QUrl(address), QUrl.fromLocalFile(address), QUrl("qrc:/qt-project.org/styles/commonstyle/images/up-16.png")):
        for kind in RESOURCE_TYPES:
            assert _read_nothing(transcript.loadResource(kind, url)), (kind, url)
            assert _read_nothing(transcript.document().resource(kind, url)), (kind, url)


@pytest.fixture()
def hang_fails(request):
    """A render that blocks (the FIFO opened) ends the run, tracebacks shown, instead of hanging it.
    The tracebacks go where pytest's own faulthandler writes (stderr before capture), if it runs."""
    try:
        from _pytest.faulthandler import fault_handler_stderr_fd_key

        stderr = request.config.stash[fault_handler_stderr_fd_key]
    except (ImportError, KeyError):
        stderr = sys.__stderr__
    faulthandler.dump_traceback_later(HANG_S, exit=True, file=stderr)
    yield
    faulthandler.cancel_dump_traceback_later()


@pytest.fixture()
def open_window(qtbot, app_settings):
    """The real main window (no model) on whatever the test put in the store."""
    from app.shell.window import MainWindow

    made = []

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


def test_the_renderer_writes_an_image_as_text_never_as_an_img():
    html = render_markdown('![a *cat*](/dev/zero "t") and <img src="/dev/zero"> and ![](x.png)')
    assert "<img" not in html and "[image: a cat]" in html and "/dev/zero" in html
    assert "&lt;img src=&quot;/dev/zero&quot;&gt;" in html  # raw HTML stays escaped text
    assert "[image]</span> x.png" in html


@pytest.mark.parametrize("kind", PROBES)
def test_a_streamed_reply_loads_no_image(qtbot, hang_fails, open_window, tmp_path, kind):
    reply, address, shown = _probe(kind, tmp_path)
    chat = _show_chat(open_window())
    chat.ready = True
    chat.current.messages.append({"role": "user", "content": "show me"})
    chat.running, chat.streaming = True, {"role": "assistant", "content": ""}
    chat.render()
    for piece in (reply[i:i + 5] for i in range(0, len(reply), 5)):
        chat.on_lane_event(LaneEvent("chat", Tokens(piece, (1,), (False,), 0, 0, 1.0)))
    qtbot.waitUntil(lambda: "there." in chat.transcript.toPlainText(), timeout=10_000)
    _assert_inert(chat.transcript, address, shown)
    chat.on_lane_event(LaneEvent("chat", Finished("eos", RunStats(new_tokens=3, tok_per_s=9.0), (), reply)))
    assert not chat.running and chat.current.messages[-1]["content"] == reply
    _assert_inert(chat.transcript, address, shown)


@pytest.mark.parametrize("kind", PROBES)
def test_a_saved_chat_opened_at_start_up_loads_no_image(hang_fails, open_window, tmp_path, kind):
    reply, address, shown = _probe(kind, tmp_path)
    saved = Conversation(title="pictures")
    saved.messages += [{"role": "user", "content": "show me"}, {"role": "assistant", "content": reply, "stats": ""}]
    ConversationStore(data_dir() / "conversations").save(saved)
    window = open_window()  # start-up opens the newest chat
    assert window.chat.current.id == saved.id
    _assert_inert(_show_chat(window).transcript, address, shown)


@pytest.mark.parametrize("kind", ("dev-zero", "fifo", "picture"))
def test_the_transcript_loads_nothing_even_for_an_img_it_is_handed(qtbot, hang_fails, tmp_path, kind):
    """The second wall alone: HTML with an <img> put straight into the transcript (past the
    renderer) is laid out and painted, and still nothing is read."""
    _, address, _ = _probe(kind, tmp_path)
    transcript = Transcript()
    qtbot.addWidget(transcript)
    transcript.resize(600, 400)
    transcript.show()
    transcript.render_turns([])  # clear() keeps the inert document
    for url in (address, QUrl.fromLocalFile(address).toString()):
        transcript.textCursor().insertHtml(f"<p>before <img src='{url}'> after</p>")
    transcript.grab()
    assert len(_images(transcript.document())) == 2
    for url in (QUrl(address), QUrl.fromLocalFile(address)):
        for kind_ in RESOURCE_TYPES:
            assert _read_nothing(transcript.document().resource(kind_, url)), (kind_, url)


def test_a_link_to_a_local_file_is_never_loaded_into_the_view(qtbot, tmp_path):
    secret = tmp_path / "secret.html"
    secret.write_text("<p>SECRET CONTENT</p>")
    transcript = Transcript()
    qtbot.addWidget(transcript)
    transcript.resize(600, 400)
    transcript.show()
    href = str(secret)  # a bare path: markdown-it already drops file: links, not this
    transcript.render_turns([{"role": "user", "content": "q"},
                             {"role": "assistant", "content": f"[open me]({href})"}])
    rect = transcript.anchor_rect(href)
    assert rect is not None
    before = transcript.toPlainText()
    qtbot.mouseClick(transcript.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    assert transcript.source().isEmpty() and transcript.toPlainText() == before
    assert "SECRET CONTENT" not in transcript.toPlainText()
