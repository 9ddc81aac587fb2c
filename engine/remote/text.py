"""Text from a remote server made safe to print to a terminal.

A model id, an error body or streamed content can carry terminal control sequences (ESC ``[2J``
clears the screen, ESC ``]0;...`` BEL retitles the window, U+009B is a one-character CSI,
carriage return overwrites the line, bidirectional overrides reorder what is shown) and lone
surrogates that a UTF-8 stdout cannot encode. Each such character becomes its visible escape
(``\\x1b``, ``\\u202e``); everything else is left as it is.
"""
from __future__ import annotations

import re

# C0 controls but tab and newline, DEL, C1 controls, bidi marks / embeddings / overrides /
# isolates, and lone surrogates.
_UNSAFE = "\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff"
_IN_TEXT = re.compile(f"[{_UNSAFE}]")
_IN_LINE = re.compile(f"[{_UNSAFE}\n\u2028\u2029]")  # one line: newlines escaped too


def _visible(match: re.Match) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, one_line: bool = False) -> str:
    """``text`` with its terminal controls shown as escapes; tabs and (unless ``one_line``)
    newlines kept, CRLF read as a newline."""
    if one_line:
        return _IN_LINE.sub(_visible, text)
    return _IN_TEXT.sub(_visible, text.replace("\r\n", "\n"))


def clipped(text: str, limit: int = 300) -> str:
    """One printable line of at most ``limit`` characters (then "...")."""
    text = printable(text.strip(), one_line=True)
    return text if len(text) <= limit else text[:limit] + "..."
