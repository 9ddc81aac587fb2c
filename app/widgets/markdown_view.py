"""A reply's Markdown as the HTML subset Qt's rich text understands (QTextDocument).

markdown-it-py parses (CommonMark + tables + strikethrough, raw HTML off: a reply is text, never
markup that could hide or restyle the transcript); Pygments colours fenced code with inline styles
(Qt's HTML has no style sheets for classes). Each fenced block gets a header with its language and
a ``copy:<message>:<block>`` link: the view copies ``code_blocks(text)[block]`` when clicked.

An image is written as text, ``[image: alt] address``, never as ``<img>``: Qt would fetch its
address while laying the reply out, and a reply (or a saved chat) may name any path, a device
that never ends (/dev/zero) or a FIFO that never opens as well as a private picture. The
transcript also refuses every resource (app/chat/chat_transcript.py), so a new way to name one fails
closed.

Replies are not always well-formed Markdown: a model often writes code without a fence. CommonMark
strips the leading spaces of a paragraph's continuation lines, so such code would lose its indents;
those spaces become no-break spaces first (and line breaks stay line breaks), so what the model
wrote lines up as it wrote it.
"""
from __future__ import annotations

import html
import re
import threading
from functools import lru_cache

from markdown_it import MarkdownIt
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import get_lexer_by_name
from pygments.lexers.special import TextLexer
from pygments.util import ClassNotFound

CODE_BACKGROUND = "#f6f8fa"
CODE_BORDER = "#b8bfc6"
INLINE_CODE_BACKGROUND = "#dde1e6"
_LEADING = re.compile(r"^[ \t]+")
_FORMATTER = HtmlFormatter(noclasses=True, nowrap=True, style="default")


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "breaks": True, "linkify": False})
    md.enable(["table", "strikethrough"])
    return md


_MD = _parser()


def code_blocks(text: str) -> list[str]:
    """The code of each fenced (or indented) block in ``text``, in order, exactly as the copy
    button copies it: the block's lines without the fence and without the final line break."""
    return [_code_of(t.content) for t in _MD.parse(_keep_indents(text)) if t.type in ("fence", "code_block")]


def _code_of(content: str) -> str:
    return content[:-1] if content.endswith("\n") else content


def render_markdown(text: str, message: int = 0, first_block: int = 0) -> str:
    """HTML for one reply (or a run of its top-level blocks); ``message`` and ``first_block``
    number the copy links of its code blocks."""
    return _MD.render(_keep_indents(text), {"message": message, "blocks": first_block})


def normalized(text: str) -> str:
    """Line breaks as the parser counts them (a prefix of a streaming reply stays a prefix)."""
    return text.replace("\r\n", "\n").replace("\r", "\n")


def finished_blocks(text: str) -> int:
    """How many leading characters of ``normalized`` text are top-level blocks that later text
    can no longer change: all but the last top-level block. A streaming view renders those once."""
    starts = [t.map[0] for t in _MD.parse(text) if t.level == 0 and t.nesting >= 0 and t.map]
    if len(starts) < 2:
        return 0
    return sum(len(line) + 1 for line in text.split("\n")[:starts[-1]])


def _keep_indents(text: str) -> str:
    """Continuation lines of top-level paragraphs keep their leading whitespace as no-break
    spaces (see the module docstring); everything else is left to the parser."""
    text = normalized(text)
    lines = text.split("\n")
    changed = False
    for token in _MD.parse(text):
        if token.type == "paragraph_open" and token.level == 0 and token.map:
            first, end = token.map
            for i in range(first + 1, min(end, len(lines))):
                indent = _LEADING.match(lines[i])
                if indent:
                    lines[i] = "\u00a0" * len(indent.group().expandtabs(4)) + lines[i][indent.end():]
                    changed = True
    return "\n".join(lines) if changed else text


@lru_cache(maxsize=256)
def _highlighted(code: str, language: str) -> str:
    """Cached: while a reply streams, its finished blocks are rendered again at every update."""
    try:
        lexer = get_lexer_by_name(language) if language else TextLexer()
    except ClassNotFound:
        lexer = TextLexer()
    return highlight(code, lexer, _FORMATTER).rstrip("\n")


#: The languages a local chat's replies use most: their lexers are read ahead (below).
COMMON_LANGUAGES = ("python", "javascript", "typescript", "bash", "json", "c", "cpp", "rust", "go", "java", "html",
                    "css", "sql", "yaml")


def warm_up_in_background() -> threading.Thread:
    """Read the common languages' lexers on a thread of their own. pygments imports a lexer's
    module the first time a block in that language is highlighted: 20-25 ms for Python, a stall
    of the window in the middle of the first reply with code. Pure Python, so the window's
    thread runs between its 5 ms slices meanwhile."""

    def read() -> None:
        for language in COMMON_LANGUAGES:
            _highlighted("x", language)

    thread = threading.Thread(target=read, name="tandem-markdown-warm-up", daemon=True)
    thread.start()
    return thread


def _code_block(code: str, language: str, href: str) -> str:
    label = html.escape(language or "code")
    return (
        f"<table width='100%' cellspacing='0' cellpadding='6' border='1' "
        f"style='border-collapse:collapse; border-color:{CODE_BORDER}; background-color:{CODE_BACKGROUND}'>"
        f"<tr><td style='border:none'><span style='color:#57606a; font-size:small'>{label}</span>"
        f"&nbsp;&nbsp;&nbsp;<a href='{href}' style='font-size:small'>Copy</a></td></tr>"
        f"<tr><td style='border:none'><pre style='font-family:monospace; margin:0'>{_highlighted(code, language)}</pre></td></tr>"
        f"</table>"
    )


def _fence(self, tokens, idx, options, env) -> str:
    token = tokens[idx]
    language = token.info.split()[0] if token.info.strip() else ""
    href = f"copy:{env['message']}:{env['blocks']}"
    env["blocks"] += 1
    return _code_block(_code_of(token.content), language, href)


def _code_inline(self, tokens, idx, options, env) -> str:
    return (f"<code style='font-family:monospace; background-color:{INLINE_CODE_BACKGROUND}'>"
            f"{html.escape(tokens[idx].content)}</code>")


def _table_open(self, tokens, idx, options, env) -> str:
    return f"<table border='1' cellspacing='0' cellpadding='4' style='border-collapse:collapse; border-color:{CODE_BORDER}'>"


def _image(self, tokens, idx, options, env) -> str:
    token = tokens[idx]
    alt = html.escape(self.renderInlineAsText(token.children or [], options, env))
    label = f"[image: {alt}]" if alt else "[image]"
    return f"<span style='color:#57606a'>{label}</span> {html.escape(str(token.attrGet('src') or ''))}"


_MD.add_render_rule("fence", _fence)
_MD.add_render_rule("image", _image)
_MD.add_render_rule("code_block", _fence)
_MD.add_render_rule("code_inline", _code_inline)
_MD.add_render_rule("table_open", _table_open)
