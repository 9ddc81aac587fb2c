"""What rendering one chat template may spend: steps, seconds and characters.

A chat template is code that comes with a model (a GGUF file's ``tokenizer.chat_template``, a
folder's tokenizer_config.json or chat_template.jinja) and runs on every request. jinja2's
sandbox keeps it away from Python's internals, not from spending without bound: ``'x' * 10**6``
printed a million times is 1 TB of text, two nested ``range(100000)`` loops with an empty body
run for hours. engine.gguf.chat_template routes every operation a template performs through
the ``Budget`` of the render in progress:

    steps     each loop item, call, filter, operator, attribute or item lookup and printed
              value is one; a render may take MAX_STEPS (a real template takes tens per message)
    seconds   MAX_SECONDS of wall time, looked at every 256 steps: the backstop where single
              steps are slow (operations on values near the size limit)
    size      no value may hold more than MAX_VALUE units, checked *before* it is built where an
              operation multiplies its inputs (repetition, widths, replace, join, formats); all
              values built in one render together at most MAX_BUILT; the text rendered at most
              MAX_OUTPUT characters

The template's own text may be MAX_TEMPLATE characters (compiling it costs time and memory in
proportion; engine.gguf.chat_template.compile_template checks it).

A unit is one character of a string; a container costs 16 per item plus its items, a number
its decimal digits, anything else nothing. Each limit is far above what a conversation needs
(MAX_OUTPUT is about a million tokens, more than any context window), and a refusal is one
``ChatTemplateRefused`` naming the limit.
"""
from __future__ import annotations

import contextlib
import contextvars
import itertools
import re
import string
import time
from collections.abc import Iterator, Mapping

from jinja2.utils import Namespace

MAX_TEMPLATE = 256 * 2**10
MAX_OUTPUT = 4 * 2**20
MAX_VALUE = 8 * 2**20
MAX_BUILT = 64 * 2**20
MAX_STEPS = 1_000_000
MAX_SECONDS = 5.0
# Chat templates count, they do not do number theory: 4096 bits is ~1,200 decimal digits.
MAX_INT_BITS = 4096

ITEM_UNITS = 16
_CLOCK_EVERY = 256


class ChatTemplateRefused(ValueError):
    """A chat template stopped for spending past a limit: ``reason`` says which, ``name`` the
    model (file or folder) it came with, where the caller knows it."""

    def __init__(self, reason: str, name: str | None = None) -> None:
        self.reason, self.name = reason, name
        subject = f"{name}: its chat template" if name else "the chat template"
        super().__init__(f"{subject} {reason}; Tandem stopped rendering it (the template is broken or hostile)")

    def named(self, name: str) -> ChatTemplateRefused:
        return ChatTemplateRefused(self.reason, name)

    def __reduce__(self):
        return ChatTemplateRefused, (self.reason, self.name)


class Budget:
    """The spending of one render: ``steps``, ``built`` (units of every value made) and
    ``output`` (characters rendered)."""

    def __init__(self) -> None:
        self.steps = self.built = self.output = 0
        self.deadline = time.monotonic() + MAX_SECONDS
        self._clock_at = _CLOCK_EVERY

    def step(self) -> None:
        self.steps += 1
        if self.steps >= self._clock_at:
            if self.steps > MAX_STEPS:
                raise ChatTemplateRefused(f"ran over {MAX_STEPS:,} steps (loop items, calls and lookups)")
            self._clock_at += _CLOCK_EVERY
            if time.monotonic() > self.deadline:
                raise ChatTemplateRefused(f"took over {MAX_SECONDS:g} s to render")

    def allow(self, units: int) -> None:
        """Refuse, before it exists, a value of ``units`` that would break a size limit."""
        if units > MAX_VALUE:
            raise ChatTemplateRefused(f"built a value of over {MAX_VALUE // 2**20} MB ({MAX_VALUE:,} characters)")
        if self.built + units > MAX_BUILT:
            raise ChatTemplateRefused(f"built over {MAX_BUILT // 2**20} MB of values ({MAX_BUILT:,} characters) "
                                      "in one render")

    def build(self, value) -> None:
        """Count a value just made (refused where it breaks a size limit)."""
        units = size(value)
        self.allow(units)
        self.built += units

    def emit(self, text: str) -> None:
        """Count a piece of the rendered text."""
        self.step()
        self.output += len(text)
        if self.output > MAX_OUTPUT:
            raise ChatTemplateRefused(f"exceeded {MAX_OUTPUT // 2**20} MB of text ({MAX_OUTPUT:,} characters)")


_current: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("chat_template_budget", default=None)


def current() -> Budget:
    """The budget of the render in progress; outside one (a template folded at compile time),
    a fresh one, so each operation's own limits still hold."""
    return _current.get() or Budget()


@contextlib.contextmanager
def rendering() -> Iterator[Budget]:
    """A fresh budget for the render inside (renders nest: the outer one's is restored)."""
    outer = _current.get()
    budget = Budget()
    _current.set(budget)
    try:
        yield budget
    finally:
        _current.set(outer)


# -- sizes -------------------------------------------------------------------------------------


def size(value, limit: int = MAX_VALUE, indent: int = 0) -> int:
    """About how many units ``value`` holds (see the module docstring), counted only until it
    passes ``limit``. ``indent``: JSON's indentation, added per item and nesting level."""
    total = _own(value)
    children = _children(value)
    stack = [(iter(children), 1)] if children is not None else []
    while stack and total <= limit:
        items, depth = stack[-1]
        item = next(items, _END)
        if item is _END:
            stack.pop()
            continue
        total += ITEM_UNITS + indent * depth + _own(item)
        nested = _children(item)
        if nested is not None:
            stack.append((iter(nested), depth + 1))
    return total


_END = object()


def _own(value) -> int:
    if isinstance(value, (str, bytes, bytearray)):
        return len(value)
    if isinstance(value, int) and not isinstance(value, bool):
        return value.bit_length() // 3 + 1
    return 2 if _children(value) is not None else 0


def _children(value):
    if isinstance(value, Mapping):
        return itertools.chain.from_iterable(value.items())
    if isinstance(value, (list, tuple, set, frozenset)):
        return value
    if isinstance(value, Namespace):
        return itertools.chain.from_iterable(object.__getattribute__(value, "_Namespace__attrs").items())
    return None


# -- operations that multiply their inputs, weighed before they run ----------------------------


def check_bits(bits: int) -> None:
    if bits > MAX_INT_BITS:
        raise ChatTemplateRefused(f"computed a number of over {MAX_INT_BITS:,} bits")


def binop_units(operator: str, left, right) -> int:
    """Units of ``left <operator> right`` where the operator can multiply its inputs (0 where
    it cannot); a number too big is refused here."""
    if operator == "*":
        if _is_count(right) and _is_sequence(left):
            return size(left) * max(right, 0)
        if _is_count(left) and _is_sequence(right):
            return size(right) * max(left, 0)
        if _is_count(left) and _is_count(right):
            check_bits(left.bit_length() + right.bit_length())
    elif operator == "**" and _is_count(left) and _is_count(right) and right > 0 and abs(left) > 1:
        check_bits(right if right > MAX_INT_BITS else right * left.bit_length())
    elif operator == "+" and _is_sequence(left) and _is_sequence(right):
        return size(left) + size(right)
    elif operator == "%" and isinstance(left, str):
        return printf_units(left, right)
    return 0


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_sequence(value) -> bool:
    return isinstance(value, (str, bytes, list, tuple))


# printf-style conversions: %[(key)][flags][width][.precision][length]type
_PRINTF = re.compile(r"%(?:\([^)]*\))?[#0 +-]*(\*|\d+)?(?:\.(\*|\d+))?[hlL]?[a-zA-Z%]")


def printf_units(fmt: str, args) -> int:
    """Units of ``fmt % args``: the format, each field's width and precision, and the
    arguments (each field may print the biggest of them)."""
    values = list(args.values()) if isinstance(args, Mapping) else list(args) if isinstance(args, tuple) else [args]
    biggest = max((size(v) for v in values), default=0)
    starred = sum(abs(v) for v in values if _is_count(v))
    total = len(fmt)
    for match in _PRINTF.finditer(fmt):
        total += biggest
        for group in match.groups():
            if group == "*":
                total += starred
            elif group:
                total += int(group)
    return total


def format_units(fmt: str, args: tuple, kwargs: Mapping) -> int:
    """Units of ``fmt.format(*args, **kwargs)`` (or ``format_map``), as ``printf_units``."""
    values = [*args, *kwargs.values()]
    biggest = max((size(v) for v in values), default=0)
    starred = sum(abs(v) for v in values if _is_count(v))
    total = len(fmt)
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:  # malformed: the call itself will say so
        return total
    for _, field, spec, _ in fields:
        if field is None:
            continue
        total += biggest + sum(int(d) for d in re.findall(r"\d+", spec or ""))
        if spec and "{" in spec:
            total += starred
    return total


def replace_units(text, old, new, count=-1) -> int:
    if not isinstance(text, (str, bytes)) or type(old) is not type(text) or type(new) is not type(text):
        return size(text)
    found = text.count(old) if old else len(text) + 1
    if _is_count(count) and count >= 0:
        found = min(found, count)
    return len(text) + found * max(len(new) - len(old), 0)


def join_units(separator, items: list) -> int:
    return size(separator) * max(len(items) - 1, 0) + sum(size(item) for item in items)


def padded_units(text, width) -> int:
    """``center`` / ``ljust`` / ``rjust`` / ``zfill``: the text, at least ``width`` long."""
    return max(size(text), width) if _is_count(width) else size(text)


def indent_units(text, width) -> int:
    prefix = len(width) if isinstance(width, str) else width if _is_count(width) else 0
    text = str(text) if not isinstance(text, str) else text
    return len(text) + (text.count("\n") + 1) * max(prefix, 0)


def wrap_units(text, width, wrapstring) -> int:
    text = text if isinstance(text, str) else ""
    lines = len(text) // max(width if _is_count(width) else 79, 1) + text.count("\n") + 1
    return len(text) + lines * len(wrapstring if isinstance(wrapstring, str) else "\n")


def tabs_units(text, tabsize) -> int:
    if not isinstance(text, (str, bytes)) or not _is_count(tabsize):
        return size(text)
    return len(text) + text.count("\t" if isinstance(text, str) else b"\t") * max(tabsize, 0)


def translate_units(text, table) -> int:
    longest = max((len(v) for v in table.values() if isinstance(v, (str, bytes))), default=1) \
        if isinstance(table, Mapping) else 1
    return size(text) * max(longest, 1)


def lipsum_units(n=5, html=True, min=20, max=100) -> int:  # noqa: A002 (jinja's names)
    words = max if _is_count(max) else 100
    return (n if _is_count(n) else 5) * words * 12

