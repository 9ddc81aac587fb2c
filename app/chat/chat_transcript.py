"""The chat transcript: finished turns rendered once, the streaming reply re-rendered alone.

One QTextDocument holds the conversation. A full render (``render_turns``) happens when a chat is
opened or a turn ends. While a reply streams, ``stream`` touches only the reply's last top-level
block: the blocks before it are finished (later text cannot change them), so each is rendered
once and kept, and an update costs one paragraph or code block, not the reply or the conversation.

Links drive the turn actions: ``copy:<message>:<block>`` (a code block's Copy), ``edit:<message>``
(edit an earlier question), ``stats:<message>`` (a reply's speed line; its tooltip says more).
No link is ever followed (``setOpenLinks(False)``): a click on any other address does nothing.

The transcript fetches nothing: its document's ``loadResource`` (and the widget's) answers every
request (image, style sheet, page; file, qrc or network address) without reading it. What it shows
comes from a model or a saved file, and Qt would otherwise read whatever path an image names while
laying the document out: /dev/zero until memory runs out, a FIFO forever, or a private file into
view. The renderer already writes images as text (app/widgets/markdown_view.py); this is the second wall,
for any way left to name one. Two Qt fallbacks shape it: when the widget answers nothing, a plain
QTextDocument reads a local or qrc address itself, so the answer is the document's; and when the
document has no image, Qt's image handler loads the file by name, so an image request gets a blank
1x1 placeholder (drawn as nothing), not nothing.
"""
from __future__ import annotations

import html
import json

from PySide6.QtCore import QEvent, QPoint, QRect, Signal
from PySide6.QtGui import QColor, QImage, QTextCursor, QTextDocument, QTextFrameFormat
from PySide6.QtWidgets import QTextBrowser, QToolTip

from app.store.attachments import describe_tokens
from app.widgets.markdown_view import code_blocks, finished_blocks, normalized, render_markdown

REPLY_BACKGROUND = "#f1f3f4"
USER_BACKGROUND = "#e8f0fe"
TOOL_BACKGROUND = "#fef7e0"
#: A tool's result is shown up to this many characters (the model read all of it).
TOOL_RESULT_SHOWN = 1500
EMPTY = ("<p style='color:#888'>Start a conversation. Replies use speculative decoding: "
         "same text as the model alone, sooner.</p>")
WAITING = "<i style='color:#999'>…</i>"


def attachments_html(attachments) -> str:
    """A user turn's attached files, one chip each: the name and its token count."""
    if not attachments:
        return ""
    chips = " ".join(
        f"<span style='background:#ffffff; color:#1a73e8'>&nbsp;{html.escape(a['name'])}"
        f"<span style='color:#5f6368'> · {html.escape(describe_tokens(a.get('tokens')) if a.get('tokens') is not None else a.get('kind', 'text'))}</span>&nbsp;</span>"
        for a in attachments)
    return f"<p style='margin-bottom:4px'><span style='color:#5f6368; font-size:small'>Attached:</span> {chips}</p>"


def user_html(index: int, content: str, attachments=()) -> str:
    # pre-wrap: HTML would collapse the leading spaces of what the person typed.
    return (attachments_html(attachments) + f"<div style='white-space:pre-wrap'>{html.escape(content)}</div>"
            f"<div align='right'><a href='edit:{index}' style='color:#5f6368; font-size:small'>Edit</a></div>")


def pretty_arguments(arguments: str) -> str:
    """A tool call's arguments (JSON text) indented for reading; text that is not JSON as it is."""
    try:
        return json.dumps(json.loads(arguments), indent=2, ensure_ascii=False)
    except ValueError:
        return arguments


def tool_calls_html(calls) -> str:
    """A reply's tool calls, one card each: the tool's name and its arguments."""
    return "".join(
        f"<p style='margin-bottom:2px'><span style='color:#5f6368'>Calls the tool</span> <b>{html.escape(c['name'])}</b></p>"
        f"<pre style='background:#ffffff'>{html.escape(pretty_arguments(c['arguments']))}</pre>" for c in calls or ())


TOOL_OUTCOMES = {"ran": "Result of", "failed": "Failed:", "declined": "Not run (declined):"}


def tool_result_html(message: dict) -> str:
    """A tool turn: what became of the call, and its result as the model read it."""
    text = message["content"]
    shown = text[:TOOL_RESULT_SHOWN]
    more = (f"<p style='color:#5f6368; font-size:small'>… and {len(text) - len(shown):,} more characters, "
            f"which the model read</p>") if len(text) > len(shown) else ""
    head = TOOL_OUTCOMES.get(message.get("outcome", ""), "Result of")
    colour = "#c5221f" if message.get("outcome") == "failed" else "#5f6368"
    body = "" if message.get("outcome") == "declined" else f"<pre>{html.escape(shown)}</pre>{more}"
    return (f"<p style='margin-bottom:2px'><span style='color:{colour}'>{head}</span> "
            f"<b>{html.escape(message.get('name') or 'tool')}</b></p>{body}")


def footer_html(index: int, note: str) -> str:
    return (f"<p><a href='stats:{index}' style='color:#888; font-size:small; text-decoration:none'>"
            f"{html.escape(note)}</a></p>")


def no_resource(kind) -> QImage | None:
    """What the transcript answers for any resource: nothing, or for an image a blank 1x1 one
    (see the module docstring)."""
    if kind != QTextDocument.ResourceType.ImageResource:
        return None
    blank = QImage(1, 1, QImage.Format.Format_ARGB32)
    blank.fill(0)
    return blank


class InertDocument(QTextDocument):
    """A document that reads no resource: see the module docstring."""

    def loadResource(self, kind, url):  # noqa: N802 (Qt's name)
        return no_resource(kind)


class Transcript(QTextBrowser):
    """Each turn is a QTextFrame with a background (a bubble). Frames, not HTML tables: Qt lays a
    table out again whole at every edit inside it (~30 ms for a long reply, ~300 ms to lay out a
    long conversation), a frame only from the edit on."""

    copy_requested = Signal(int, int)  # message index, code block index
    edit_requested = Signal(int)  # message index

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.setDocument(InertDocument(self))
        self.setOpenLinks(False)
        self.anchorClicked.connect(self._clicked)
        self._bubble = None  # the streaming reply's QTextFrame
        self._stream_index = 0
        self._frozen_chars = 0  # leading characters of the reply rendered for good
        self._frozen_blocks = 0  # code blocks among them (the next Copy link's number)
        self._frozen_text = ""
        self._tail_pos = 0  # where the unfinished last block's rendering starts
        self.tooltips: dict[int, str] = {}
        self._warm_up()

    def _warm_up(self) -> None:
        """Lay out one turn of each kind before the window shows. Qt's first layout of frames,
        pre-wrapped text and a code block's table in a process costs ~30 ms more than any later
        one: paid here, while the window is being built, rather than as a stall when the first
        message (a pasted file, say) is sent."""
        reply = "A reply with `code`:\n\n```\ndef f(x):\n    return x + 1\n```\n\n| a | b |\n|---|---|\n| 1 | 2 |"
        self.render_turns([{"role": "user", "content": "def f(x):\n    return x\n"},
                           {"role": "assistant", "content": reply, "stats": "warm-up"}])
        self.document().size()  # the layout itself
        self.clear()

    def loadResource(self, kind, url):  # noqa: N802 (Qt's name)
        """No resource is read (the document answers itself first; this is for any other caller)."""
        return no_resource(kind)

    def render_turns(self, messages: list[dict], streaming: str | None = None, tooltips: dict[int, str] | None = None) -> None:
        """Render the finished turns, and the streaming reply after them when there is one."""
        self.tooltips = tooltips or {}
        self.clear()
        self._bubble = None
        cursor = QTextCursor(self.document())
        for i, m in enumerate(messages):
            if m["role"] == "user":
                self._insert_bubble(cursor, user_html(i, m["content"], m.get("attachments")), user=True)
            elif m["role"] == "tool":
                self._insert_bubble(cursor, tool_result_html(m), user=False, background=TOOL_BACKGROUND)
            else:
                calls = m.get("tool_calls")
                body = render_markdown(m["content"], i) if m["content"] else ("" if calls else WAITING)
                body += tool_calls_html(calls)
                self._insert_bubble(cursor, body + (footer_html(i, m["stats"]) if m.get("stats") else ""), user=False)
        if streaming is not None:
            self._bubble = self._insert_bubble(cursor, "", user=False)
            self._stream_index = len(messages)
            self._frozen_chars = self._frozen_blocks = 0
            self._frozen_text = ""
            self._tail_pos = self._bubble.firstPosition()
            self.stream(streaming)
        elif not messages:
            cursor.insertHtml(EMPTY)
        self._scroll_to_end()

    def _insert_bubble(self, cursor: QTextCursor, body: str, user: bool, background: str | None = None):
        width = max(200, self.viewport().width())
        fmt = QTextFrameFormat()
        fmt.setBackground(QColor(background or (USER_BACKGROUND if user else REPLY_BACKGROUND)))
        fmt.setPadding(8)
        fmt.setBottomMargin(6)
        fmt.setLeftMargin(width // 5 if user else 0)
        fmt.setRightMargin(0 if user else width // 10)
        frame = cursor.insertFrame(fmt)
        if body:
            cursor.insertHtml(body)
        cursor.setPosition(frame.lastPosition() + 1)  # on past the frame, in the document's own block
        return frame

    def stream(self, text: str) -> None:
        """Show the streaming reply as ``text``: render newly finished blocks once, then the last one."""
        if self._bubble is None:
            return
        bar = self.verticalScrollBar()
        follow = bar.value() >= bar.maximum() - 4  # keep following unless the person scrolled up
        text = normalized(text)
        rest = text[self._frozen_chars:]
        done = finished_blocks(rest)
        cursor = self._select(self._tail_pos, self._bubble.lastPosition())
        if done:
            finished = rest[:done]
            cursor.insertHtml(render_markdown(finished, self._stream_index, self._frozen_blocks))
            cursor.insertBlock()  # the unfinished block starts a block of its own
            self._tail_pos = cursor.position()
            self._frozen_chars += done
            self._frozen_text += finished
            self._frozen_blocks += len(code_blocks(finished))
            rest = rest[done:]
        cursor.insertHtml(render_markdown(rest, self._stream_index, self._frozen_blocks) if rest.strip() else WAITING)
        if follow:
            self._scroll_to_end()

    def finish_stream(self, text: str, note: str, tooltip: str = "") -> bool:
        """The reply ended: render its last block, add its speed line; the rest stays as it is.
        False (nothing done) when the final text does not extend what was already rendered for
        good (the engine trimmed a stop string): the caller renders the conversation again."""
        if self._bubble is None or not normalized(text).startswith(self._frozen_text):
            return False
        self.stream(text)
        if note:
            cursor = QTextCursor(self.document())
            cursor.setPosition(self._bubble.lastPosition())
            cursor.insertHtml(footer_html(self._stream_index, note))
        if tooltip:
            self.tooltips[self._stream_index] = tooltip
        self._bubble = None
        return True

    def _select(self, start: int, end: int) -> QTextCursor:
        cursor = QTextCursor(self.document())
        cursor.setPosition(start)
        cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
        return cursor

    def _scroll_to_end(self) -> None:
        bar = self.verticalScrollBar()
        bar.setValue(bar.maximum())

    # --- links --------------------------------------------------------------------------------
    def _clicked(self, url) -> None:
        scheme, _, rest = url.toString().partition(":")
        try:
            numbers = [int(n) for n in rest.split(":")]
        except ValueError:
            return
        if scheme == "copy" and len(numbers) == 2:
            self.copy_requested.emit(*numbers)
        elif scheme == "edit" and len(numbers) == 1:
            self.edit_requested.emit(numbers[0])

    def anchor_rect(self, href: str) -> QRect | None:
        """Where the link ``href`` is drawn, in viewport coordinates (scrolled into view)."""
        block = self.document().begin()
        while block.isValid():
            it = block.begin()
            while not it.atEnd():
                fragment = it.fragment()
                if fragment.charFormat().anchorHref() == href:
                    cursor = QTextCursor(self.document())
                    cursor.setPosition(fragment.position() + max(0, fragment.length() // 2))
                    self.setTextCursor(cursor)
                    self.ensureCursorVisible()
                    return self.cursorRect(cursor)
                it += 1
            block = block.next()
        return None

    def tooltip_at(self, pos: QPoint) -> str:
        scheme, _, rest = self.anchorAt(pos).partition(":")
        if scheme == "stats" and rest.isdigit():
            return self.tooltips.get(int(rest), "")
        if scheme == "copy":
            return "Copy this code block"
        return ""

    def viewportEvent(self, event) -> bool:
        if event.type() == QEvent.Type.ToolTip:
            text = self.tooltip_at(event.pos())
            if text:
                QToolTip.showText(event.globalPos(), text, self.viewport())
            else:
                QToolTip.hideText()
            return True
        return super().viewportEvent(event)
