"""What a file response must satisfy before its bytes are kept.

The listing declares each file's size (and the HEAD request's X-Linked-Size / Content-Length
must agree with it); a body is a continuation of the bytes already on disk. A server that
announces more than the file lacks, or answers a resume with another range, is refused before
anything is written; one that keeps sending past the end is stopped by the transfer at the
declared size (``engine.hub.transfer``). The final hash check still guards everything else.
"""
from __future__ import annotations

from engine.hub.files import HubFile


class IntegrityError(Exception):
    """The bytes do not match the size or hash the Hub published."""


class BodyTooLong(IntegrityError):
    """The server sent (or announced) more bytes than the file has."""



def check_announced_length(headers, room: int, f: HubFile, label: str) -> None:
    """A Content-Length beyond what the file lacks is refused before a byte is written. (Not
    for an encoded body, whose length is of the encoding; its decoded bytes are capped anyway.)"""
    announced = headers.get("Content-Length")
    encoded = headers.get("Content-Encoding", "identity").lower() not in ("", "identity")
    if announced is None or encoded or not announced.isdigit() or int(announced) <= room:
        return
    raise BodyTooLong(
        f"{label}: the server announced a body of {int(announced):,} bytes (Content-Length) where"
        f" {room:,} of the file's {f.size:,} bytes were missing; refused it before writing and deleted"
        " the partial copy. Downloading again fetches it afresh.")


def check_resumed_range(content_range: str | None, resume: int, f: HubFile, label: str) -> None:
    """A 206 answer must continue at the byte asked for, in a file of the declared size:
    appending any other range would splice two different pieces together."""
    if content_range is None:
        return  # some servers omit it; the final hash check still guards the result
    unit, _, spec = content_range.partition(" ")
    span, _, total = spec.partition("/")
    start = span.split("-", 1)[0]
    if unit != "bytes" or not start.isdigit() or int(start) != resume or (total not in ("*", "") and total != str(f.size)):
        raise IntegrityError(
            f"{label}: asked to resume at byte {resume:,} of {f.size:,}, the server answered with"
            f" {content_range!r}; refusing to splice it in. The bytes already here are kept.")
