"""Chat templates rendered in a sandbox with limits, for every tokenizer transformers builds.

A model's chat template (``tokenizer.chat_template`` in a GGUF file, tokenizer_config.json or
chat_template.jinja in a folder) is code its author wrote, run by ``apply_chat_template`` on
every request. transformers already renders it in jinja2's ``ImmutableSandboxedEnvironment``,
which keeps it away from Python's internals, but not from memory and time: one template that
prints ``'x' * 10**6`` a million times asks for 1 TB, one with two nested empty loops runs for
hours. Here the same environment (transformers' globals, filters and extensions, so templates
render exactly as before) routes everything a template does through engine.gguf.template_budget:

    operators      ``+ - * / // % **`` are intercepted (the sandbox's ``call_binop``):
                   repetition, concatenation and ``%`` formats are weighed before they run
    ``~``          rewritten into a filter that weighs its parts before joining them
    loops          each ``for`` iterates through a counter (one step an item)
    calls          every call (``call``): string methods that pad, replace, join, expand or
                   format are weighed first, every result is counted
    filters        each wrapped the same way (``center``, ``indent``, ``replace``, ``join``,
                   ``format``, ``tojson``, ``wordwrap``, ``sum``, ``batch``, ``slice``)
    lookups        attribute and item lookups are steps; slices are counted
    output         every printed value is counted (``finalize``), every block or macro body
                   before it is joined, the rendered text as it streams (``render`` and
                   ``generate``)

``install()`` makes transformers compile chat templates here (it replaces
``transformers.utils.chat_template_utils._compile_jinja_template``, the one function its
tokenizers and processors compile with), so no caller of ``apply_chat_template`` can bypass
the limits. ``guard(tokenizer, name)`` installs it and makes the tokenizer's refusals name the
model file or folder: "model.gguf: its chat template exceeded 4 MB of text ...".
"""
from __future__ import annotations

import functools
import logging
from collections.abc import Iterable, Iterator, Mapping

from jinja2 import nodes
from jinja2.runtime import markup_join, str_join
from jinja2.sandbox import MAX_RANGE, ImmutableSandboxedEnvironment, safe_range
from jinja2.utils import _PassArg, generate_lorem_ipsum, pass_context, pass_eval_context
from jinja2.visitor import NodeTransformer
from jinja2.environment import Template

from engine.gguf import template_budget as tb
from engine.gguf.template_budget import ChatTemplateRefused

__all__ = ["ChatTemplateRefused", "compile_template", "guard", "install"]

log = logging.getLogger(__name__)

# Filter names a template cannot spell (they hold a dot): the rewritten ``for`` and ``~``.
_LOOP = "tandem.loop"
_JOIN = "tandem.join"


class BoundedTemplate(Template):
    """A template whose whole output is counted as it is produced."""

    def render(self, *args, **kwargs) -> str:
        with tb.rendering() as budget:
            context = self.new_context(dict(*args, **kwargs))
            try:
                parts = []
                for part in self.root_render_func(context):
                    budget.emit(part)
                    parts.append(part)
                return "".join(parts)
            except RecursionError:
                raise _too_deep() from None
            except Exception:
                self.environment.handle_exception()

    def generate(self, *args, **kwargs) -> Iterator[str]:
        with tb.rendering() as budget:
            context = self.new_context(dict(*args, **kwargs))
            try:
                for part in self.root_render_func(context):
                    budget.emit(part)
                    yield part
            except RecursionError:
                raise _too_deep() from None
            except Exception:
                yield self.environment.handle_exception()


def _too_deep() -> ChatTemplateRefused:
    # A macro that calls itself without end stops at Python's recursion limit, within
    # milliseconds; the bare RecursionError would name neither the template nor the model.
    return ChatTemplateRefused("called its macros too deeply (a macro that calls itself without end)")


class BoundedSandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, every operation a step of the current render's budget."""

    template_class = BoundedTemplate
    intercepted_binops = frozenset({"+", "-", "*", "/", "//", "%", "**"})

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, finalize=_printed, **kwargs)

    def _parse(self, source, name, filename):
        tree = _Rewrite().visit(super()._parse(source, name, filename))
        tree.set_environment(self)
        return tree

    def call_binop(self, context, operator, left, right):
        budget = tb.current()
        budget.step()
        budget.allow(tb.binop_units(operator, left, right))
        result = super().call_binop(context, operator, left, right)
        budget.build(result)
        return result

    def getattr(self, obj, attribute):
        tb.current().step()
        return super().getattr(obj, attribute)

    def getitem(self, obj, argument):
        budget = tb.current()
        budget.step()
        value = super().getitem(obj, argument)
        if isinstance(argument, slice):
            budget.build(value)
        return value

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's signature)
        budget = tb.current()
        budget.step()
        units, args = _call_units(__obj, args, kwargs)
        budget.allow(units)
        result = super().call(__context, __obj, *args, **kwargs)
        budget.build(result)
        return result

    def concat(self, parts) -> str:
        """Joins a block's or macro's buffer (``{% set %}`` blocks, macros, ``caller()``)."""
        parts = list(parts)
        budget = tb.current()
        budget.step()
        budget.allow(sum(len(p) for p in parts))
        return "".join(parts)


def _printed(value):
    """``finalize``: each value a template prints, counted before ``str()`` makes its text."""
    tb.current().build(value)
    return value


class _Rewrite(NodeTransformer):
    """Every ``for`` iterates through the step counter; every ``a ~ b`` is the checked join."""

    def visit_For(self, node: nodes.For) -> nodes.For:
        self.generic_visit(node)
        node.iter = nodes.Filter(node.iter, _LOOP, [], [], None, None, lineno=node.iter.lineno)
        return node

    def visit_Concat(self, node: nodes.Concat) -> nodes.Filter:
        self.generic_visit(node)
        parts = nodes.List(list(node.nodes), lineno=node.lineno)
        return nodes.Filter(parts, _JOIN, [], [], None, None, lineno=node.lineno)


class _Counted:
    """An iterable whose items are steps; its length is its source's (``loop.length``)."""

    def __init__(self, items: Iterable, budget: tb.Budget) -> None:
        self.items, self.budget = items, budget

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        for item in self.items:
            self.budget.step()
            yield item


@pass_context
def _loop(context, items):
    return _Counted(items, tb.current())


@pass_eval_context
def _join(eval_context, parts: list) -> str:
    budget = tb.current()
    budget.step()
    budget.allow(sum(tb.size(p) for p in parts))
    result = (markup_join if eval_context.autoescape or eval_context.volatile else str_join)(parts)
    budget.build(result)
    return result


# -- what a filter or call would build, before it runs ----------------------------------------


def _text(value):
    """``value`` as the text a filter makes of it (refused first where that text is too big)."""
    if isinstance(value, str):
        return value
    tb.current().allow(tb.size(value))
    return str(value)


def _listed(value) -> list:
    """An iterable's items, counted as they are taken (filters that join or add them)."""
    budget = tb.current()
    items = []
    for item in value:
        budget.step()
        items.append(item)
    return items


def _sum_start(items, start) -> None:
    """``sum`` of strings, lists or tuples builds one new sequence per item."""
    budget = tb.current()
    total = tb.size(start)
    for item in items:
        total += tb.size(item)
        budget.allow(total)
        budget.built += total


def _filter_units(name: str, value, args: tuple, kwargs: dict):
    """(units the filter ``name`` would build, its value) where it multiplies its input; a
    one-pass iterable it would consume is listed first (and passed on as that list)."""

    def arg(i: int, key: str, default=None):
        return args[i] if len(args) > i else kwargs.get(key, default)

    if name == "center":
        return tb.padded_units(value, arg(0, "width", 80)), value
    if name == "indent":
        return tb.indent_units(value, arg(0, "width", 4)), value
    if name == "replace":
        count = arg(2, "count")
        text = _text(value)
        return tb.replace_units(text, _text(arg(0, "old", "")), _text(arg(1, "new", "")),
                                -1 if count is None else count), text
    if name == "format":
        return tb.printf_units(_text(value), kwargs or args), value
    if name == "wordwrap":
        return tb.wrap_units(value, arg(0, "width", 79), arg(2, "wrapstring")), value
    if name == "tojson":
        indent = arg(1, "indent")
        width = len(indent) if isinstance(indent, str) else indent if isinstance(indent, int) else 0
        ascii_factor = 12 if arg(0, "ensure_ascii", False) else 1
        return tb.size(value, indent=max(width, 0)) * ascii_factor, value
    if name in ("string", "pprint"):
        return tb.size(value), value
    if name == "join":
        items = value if isinstance(value, (list, tuple)) else _listed(value)
        return tb.join_units(arg(0, "d", ""), items), items
    if name == "sum":
        start = arg(1, "start", 0)
        if isinstance(start, (str, bytes, list, tuple)):
            value = _listed(value)
            _sum_start(value, start)
        return 0, value
    if name == "batch":
        count, fill = arg(0, "linecount", 0), arg(1, "fill_with")
        return (count * tb.ITEM_UNITS if fill is not None and isinstance(count, int) else 0), value
    if name == "slice":
        count = arg(0, "slices", 0)
        return (count * tb.ITEM_UNITS if isinstance(count, int) else 0) + tb.size(value), value
    return 0, value


_PADDING = ("center", "ljust", "rjust", "zfill")


def _call_units(obj, args: tuple, kwargs: dict):
    """(units the call would build, its arguments) for the calls that multiply their input:
    string methods that pad, expand, replace, join, translate or format, and ``lipsum``;
    a ``range`` longer than the sandbox's is refused here."""
    if obj is generate_lorem_ipsum:
        return tb.lipsum_units(*args, **kwargs), args
    if obj is safe_range:  # the sandbox refuses it too, but with a message that names no model
        try:
            items = len(range(*args))
        except (TypeError, ValueError, OverflowError):
            return 0, args
        if items > MAX_RANGE:
            raise ChatTemplateRefused(f"asked for a range of {items:,} items (at most {MAX_RANGE:,})")
        return 0, args
    wrapped = getattr(obj, "__wrapped__", obj)  # the sandbox's safe str.format wraps the method
    subject = getattr(wrapped, "__self__", None)
    if not isinstance(subject, (str, bytes)):
        return 0, args
    method = getattr(wrapped, "__name__", "")
    if method in _PADDING and args:
        return tb.padded_units(subject, args[0]), args
    if method == "expandtabs":
        return tb.tabs_units(subject, args[0] if args else kwargs.get("tabsize", 8)), args
    if method == "replace" and len(args) >= 2:
        return tb.replace_units(subject, args[0], args[1], args[2] if len(args) > 2 else kwargs.get("count", -1)), args
    if method == "join" and args:
        items = args[0] if isinstance(args[0], (list, tuple)) else _listed(args[0])
        return tb.join_units(subject, items), (items, *args[1:])
    if method == "translate" and args:
        return tb.translate_units(subject, args[0]), args
    if method == "format":
        return tb.format_units(subject, args, kwargs), args
    if method == "format_map" and args and isinstance(args[0], Mapping):
        return tb.format_units(subject, (), args[0]), args
    return 0, args


def _bounded_filter(name: str, func):
    """``func`` (a filter) as a step that weighs what it builds and counts its result."""
    pass_arg = _PassArg.from_obj(func)

    @pass_context
    def bounded(context, value, *args, **kwargs):
        budget = tb.current()
        budget.step()
        units, value = _filter_units(name, value, args, kwargs)
        budget.allow(units)
        first = {_PassArg.context: (context,), _PassArg.eval_context: (context.eval_ctx,),
                 _PassArg.environment: (context.environment,)}.get(pass_arg, ())
        result = func(*first, value, *args, **kwargs)
        if isinstance(result, Iterator):  # map, select, ...: lazy; their items are steps
            return iter(_Counted(result, budget))
        budget.build(result)
        return result

    bounded.__name__ = f"bounded_{name}"
    return bounded


# -- transformers' compiler, replaced ----------------------------------------------------------

_transformers_compile = None  # transformers' own (uncached) compiler, once install() ran


def _environment() -> BoundedSandbox:
    """A bounded sandbox set up as transformers sets up its own for a chat template: the same
    options, extensions (``{% generation %}``, loop controls), globals and filters."""
    reference = _transformers_compile("").environment
    env = BoundedSandbox(trim_blocks=reference.trim_blocks, lstrip_blocks=reference.lstrip_blocks,
                         extensions=[type(e) for e in reference.extensions.values()])
    env.globals.update(reference.globals)
    env.tests.update(reference.tests)
    filters = {**env.filters, **reference.filters}
    env.filters.clear()
    env.filters.update({name: _bounded_filter(name, f) for name, f in filters.items()})
    env.filters[_LOOP] = _loop
    env.filters[_JOIN] = _join
    return env


@functools.lru_cache(maxsize=64)
def compile_template(chat_template: str) -> BoundedTemplate:
    """``chat_template`` compiled in its own bounded sandbox (cached per template text, as
    transformers caches its own). Compiling takes time and memory in proportion to the text
    (~3 s and 100 MB for 256 KiB; real templates are under 20 KiB), so longer text is refused."""
    install()
    if len(chat_template) > tb.MAX_TEMPLATE:
        raise ChatTemplateRefused(f"is {len(chat_template):,} characters long (at most {tb.MAX_TEMPLATE:,})")
    try:
        return _environment().from_string(chat_template)
    except RecursionError:  # parentheses or blocks nested thousands deep
        raise ChatTemplateRefused("nests too deeply to compile") from None


def install() -> None:
    """Make transformers compile every chat template with ``compile_template`` (once per process)."""
    global _transformers_compile
    from transformers.utils import chat_template_utils

    if chat_template_utils._compile_jinja_template is compile_template:
        return
    _transformers_compile = chat_template_utils._cached_compile_jinja_template
    chat_template_utils._compile_jinja_template = compile_template
    log.debug("chat templates render with limits (engine.gguf.chat_template)")


class _NamedRefusals:
    """A tokenizer's ``apply_chat_template`` whose refusals name the model they came with."""

    def __init__(self, tokenizer, name: str) -> None:
        self.tokenizer, self.name = tokenizer, name

    def __call__(self, *args, **kwargs):
        try:
            return type(self.tokenizer).apply_chat_template(self.tokenizer, *args, **kwargs)
        except ChatTemplateRefused as exc:
            raise exc.named(self.name) from None


def guard(tokenizer, name: str):
    """``tokenizer`` (returned), its chat template rendered with limits (``install``) and its
    refusals naming ``name`` (the model's file or folder). None passes through."""
    if tokenizer is None:
        return None
    install()
    tokenizer.apply_chat_template = _NamedRefusals(tokenizer, name)
    return tokenizer
