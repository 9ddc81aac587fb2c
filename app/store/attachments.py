"""Files attached to a chat message: read into text, and written into the user's turn.

A text or code file is read as UTF-8; a PDF's text is extracted with pypdf. Only a regular file is
read (a FIFO or a device is refused before a byte is read, as app/store/json_files.py does), and a size
cap keeps a stray video or a log of gigabytes out of memory. Each refusal is an AttachmentError
whose message says what the person should know.

In the prompt an attachment is a fenced block headed by its name, ahead of what the person typed
(engine.session.saved_turns writes it, for the chat and for `tandem distill`'s reading of saved
conversations alike). The file's text stays verbatim in the prompt, so when the reply is an edit of
the file, prompt lookup (and a draft model) can copy long runs of it and the target accepts them.

Nothing here imports Qt or torch: reading runs on the engine's worker thread (app/bridge/jobs.py), and
the conversation (app/store/conversations.py) builds what the model sees from the same functions.
"""
from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path

from engine.session.saved_turns import file_block

#: A text file's cap: far more than a context window holds (~4 bytes a token), small enough to read at once.
MAX_TEXT_BYTES = 2 * 2**20
#: A PDF's cap: pages carry fonts and images besides their text.
MAX_PDF_BYTES = 32 * 2**20
#: The extracted text of a PDF is held to the text cap too.
MAX_PDF_PAGES = 2000

class AttachmentError(ValueError):
    """The file cannot be attached; the message names the file and says why."""


@dataclass(frozen=True)
class Attachment:
    """One attached file as the conversation keeps it: its name, kind ("text" or "pdf") and text."""

    name: str
    text: str
    kind: str = "text"
    #: Tokens of ``block(self)`` with the loaded model's tokenizer; None until counted.
    tokens: int | None = None

    def to_json(self) -> dict:
        return {"name": self.name, "kind": self.kind, "text": self.text, "tokens": self.tokens}

    @classmethod
    def from_json(cls, raw: dict) -> "Attachment":
        return cls(name=raw["name"], text=raw["text"], kind=raw.get("kind", "text"), tokens=raw.get("tokens"))


def read_attachment(path: Path) -> Attachment:
    """The file at ``path`` as an Attachment (tokens not counted); AttachmentError when it cannot be."""
    path = Path(path)
    if path.suffix.lower() == ".pdf":
        return Attachment(path.name, pdf_text(path.name, _read_bytes(path, MAX_PDF_BYTES)), "pdf")
    data = _read_bytes(path, MAX_TEXT_BYTES)
    return Attachment(path.name, decode_text(path.name, data))


def _read_bytes(path: Path, max_bytes: int) -> bytes:
    """The bytes of the regular file ``path``, at most ``max_bytes``. Opened non-blocking, checked
    on the open file: a FIFO opens at once and is refused, nothing can be swapped in between."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_BINARY", 0)
    try:
        with open(path, "rb", opener=lambda p, _: os.open(p, flags)) as f:
            info = os.fstat(f.fileno())
            if stat.S_ISDIR(info.st_mode):
                raise AttachmentError(f"{path.name} is a folder: attach the files in it")
            if not stat.S_ISREG(info.st_mode):
                raise AttachmentError(f"{path.name} is not a regular file (a pipe, socket or device): only files can be attached")
            if info.st_size > max_bytes:
                raise AttachmentError(f"{path.name} is {info.st_size:,} bytes: larger than the {_size(max_bytes)} a file may be")
            data = f.read(max_bytes + 1)
    except IsADirectoryError:
        raise AttachmentError(f"{path.name} is a folder: attach the files in it") from None
    except FileNotFoundError:
        raise AttachmentError(f"{path.name} no longer exists") from None
    except PermissionError:
        raise AttachmentError(f"{path.name} cannot be read: permission denied") from None
    except OSError as exc:
        raise AttachmentError(f"{path.name} cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:  # it grew after the check
        raise AttachmentError(f"{path.name} is larger than the {_size(max_bytes)} a file may be")
    return data


def decode_text(name: str, data: bytes) -> str:
    """UTF-8 text (a BOM dropped, line ends made \\n); AttachmentError for binary data."""
    if b"\x00" in data[:8192]:
        raise AttachmentError(f"{name} is a binary file, not text: only text, code and PDF files can be attached")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AttachmentError(f"{name} is not UTF-8 text (byte {exc.start:,} cannot be decoded): "
                              "save it as UTF-8, or attach a text, code or PDF file") from None
    return text.replace("\r\n", "\n").replace("\r", "\n")


def pdf_text(name: str, data: bytes) -> str:
    """The text of a PDF's pages, a blank line between pages; AttachmentError when it has none."""
    import io

    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted:
            try:
                reader.decrypt("")  # many "protected" PDFs open with an empty password
            except Exception:  # noqa: BLE001 (pypdf raises several kinds here)
                raise AttachmentError(f"{name} is password-protected: its text cannot be read") from None
        if len(reader.pages) > MAX_PDF_PAGES:
            raise AttachmentError(f"{name} has {len(reader.pages):,} pages: more than the {MAX_PDF_PAGES:,} read")
        pages, size = [], 0
        for page in reader.pages:
            text = (page.extract_text() or "").strip()
            size += len(text)
            if size > MAX_TEXT_BYTES:
                raise AttachmentError(f"{name} holds more than {_size(MAX_TEXT_BYTES)} of text: attach fewer pages")
            pages.append(text)
    except AttachmentError:
        raise
    except (PdfReadError, ValueError, KeyError, TypeError, AttributeError, IndexError) as exc:
        raise AttachmentError(f"{name} is not a readable PDF ({exc})") from None
    text = "\n\n".join(p for p in pages if p)
    if not text.strip():
        raise AttachmentError(f"{name} has no text to extract (a scanned PDF holds pictures of pages): "
                              "nothing to attach")
    return text


def block(attachment: Attachment) -> str:
    """The attachment as the model reads it (engine.session.saved_turns.file_block)."""
    return file_block(attachment.name, attachment.text, attachment.kind)


def over_budget(prompt_tokens: int, window: int, max_new_tokens: int, attachments: list[tuple[str, int | None]] = ()) -> str:
    """Why a request does not fit, or "" when it does: the prompt (history, message and files)
    plus room for the reply must fit the ``window``. The room is the reply's ``max_new_tokens``,
    at most half the window (Max tokens may be set as high as the window itself, which would
    refuse every message). Names the file to remove when removing it would make the request fit;
    nothing is ever cut to make it fit."""
    reserved = min(max_new_tokens, window // 2)
    over = prompt_tokens + reserved - window
    if over <= 0:
        return ""
    text = (f"Not sent: the chat with this message is {prompt_tokens:,} tokens; with {reserved:,} kept for the "
            f"reply (Max tokens) that is {over:,} tokens over the model's {window:,}-token context window.")
    counted = [(name, tokens) for name, tokens in attachments if tokens]
    if counted:
        name, tokens = max(counted, key=lambda item: item[1])
        if tokens >= over:
            return text + (f" {name} ({tokens:,} tokens) is too large by {over:,} tokens: remove it or attach a "
                           "shorter part of it, or lower Max tokens.")
        total = sum(t for _, t in counted)
        if total >= over:
            return text + (f" The attached files ({total:,} tokens) are too large by {over:,} tokens: "
                           f"remove some of them, or lower Max tokens.")
        return text + (f" Even without the attached files ({total:,} tokens) it is too long: start a new chat, "
                       "shorten the message, or lower Max tokens.")
    return text + " Start a new chat, shorten the message, or lower Max tokens."


def describe_tokens(tokens: int | None) -> str:
    return "counting…" if tokens is None else f"{tokens:,} token{'s' if tokens != 1 else ''}"


def _size(n: int) -> str:
    if n >= 2**20:
        return f"{n / 2**20:.1f} MB".replace(".0 MB", " MB")
    if n >= 1024:
        return f"{n / 1024:.0f} KB"
    return f"{n} bytes"
