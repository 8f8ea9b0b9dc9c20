"""jinja2's SandboxedEnvironment with bounds on the size of what a template can build.

The sandbox stops attribute tricks (code execution), and ``render`` stops a template that
runs too long, but a single C-level operation such as ``'%0900000000d' % 1`` or
``'x'.center(10**9)`` builds a gigabyte before any Python-level check can run. Reference
files are untrusted, and a template only ever needs to build a URL or a key, so every
operation that can make a big string, list or integer from small inputs is checked
*before* it runs: repetition, concatenation (``+`` and ``~``), ``%`` and ``str.format``
widths and precisions, string methods and filters with a width or count.
"""

from __future__ import annotations

import math
import os
import re
import resource
import string
import time
import types
from collections.abc import Iterable
from typing import Any

from jinja2.compiler import CodeGenerator, Frame
from jinja2.nodes import Concat
from jinja2.sandbox import SandboxedEnvironment, SecurityError

MAX_RENDERED = 1 << 20  # characters (or items) any one value may have
RENDER_MEMORY = 2 << 30  # bytes rendering may allocate (MemoryCap)
MAX_INT_BITS = 1 << 16  # integers: far beyond any offset, far below a slow multiplication

_SIZED = (str, bytes, list, tuple)
# "%%", or a conversion spec: (name), flags, width, .precision
_PERCENT_SPEC = re.compile(r"%%|%(?:\([^)]*\))?[-#0 +]*(\*|\d*)(?:\.(\*|\d*))?")


def _refuse(what: str) -> None:
    raise SecurityError(what)


def _check_size(n: int, what: str) -> None:
    if n > MAX_RENDERED:
        _refuse(f"{what} result too large")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_percent_format(fmt: str) -> None:
    """Widths and precisions of a ``%`` format make output of that size."""
    for m in _PERCENT_SPEC.finditer(fmt):
        for g in m.groups():
            if g == "*":
                _refuse("'*' width or precision in a format")
            if g and int(g) > MAX_RENDERED:
                _refuse("format width or precision too large")


def check_brace_format(fmt: str) -> None:
    """The same for ``str.format``; nested fields (``{0:{1}}``) would hide the width."""
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return  # malformed: str.format itself reports it
    for _text, _name, spec, _conv in fields:
        if not spec:
            continue
        if "{" in spec:
            _refuse("nested fields in a format spec")
        if any(int(n) > MAX_RENDERED for n in re.findall(r"\d+", spec)):
            _refuse("format width or precision too large")


def _joined_size(sep: str, items: list[Any]) -> int:
    return sum(len(x) if isinstance(x, str) else len(str(x)) for x in items) + len(sep) * max(
        len(items) - 1, 0)


def _replaced_size(s: str, old: Any, new: Any, count: Any = -1) -> int:
    if not (isinstance(s, str) and isinstance(old, str) and isinstance(new, str)):
        return len(s)
    n = s.count(old) if old else len(s) + 1
    if _is_int(count) and count >= 0:
        n = min(n, count)
    return len(s) + n * len(new)


def _check_str_method(owner: str | bytes, name: str, args: tuple, kwargs: dict) -> tuple:
    """Refuses a call of a str/bytes method whose result would be too large; returns args
    (``join``'s iterable is materialized once to be measured)."""
    for v in (*args, *kwargs.values()):
        if _is_int(v) and v > MAX_RENDERED:
            _refuse(f"{name}() argument too large")
    if name == "expandtabs":
        tab = args[0] if args else kwargs.get("tabsize", 8)
        if _is_int(tab):
            _check_size(len(owner) + owner.count("\t" if isinstance(owner, str) else b"\t") * tab,
                        name)
    elif name == "replace" and len(args) >= 2 and isinstance(owner, str):
        _check_size(_replaced_size(owner, *args[:3]), name)
    elif name == "join" and args and isinstance(owner, str):
        items = _take(args[0], name)
        _check_size(_joined_size(owner, items), name)
        args = (items, *args[1:])
    return args


def _take(iterable: Iterable[Any], what: str) -> list[Any]:
    items: list[Any] = []
    for x in iterable:
        items.append(x)
        if len(items) > MAX_RENDERED:
            _refuse(f"{what} of too many items")
    return items


def _bounded_filters(filters: dict[str, Any]) -> dict[str, Any]:
    """The built-in filters that take a width or count, checked before they run."""
    center, indent, batch, slice_ = (filters[k] for k in ("center", "indent", "batch", "slice"))
    fmt, join, replace = filters["format"], filters["join"], filters["replace"]

    def f_center(value: Any, width: int = 80) -> Any:
        if _is_int(width):
            _check_size(width, "center")
        return center(value, width)

    def f_indent(s: Any, width: int | str = 4, first: bool = False, blank: bool = False) -> Any:
        w = width if _is_int(width) else len(str(width))
        text = str(s)
        _check_size(len(text) + w * (text.count("\n") + 1), "indent")
        return indent(s, width, first, blank)

    def f_batch(value: Any, linecount: int, fill_with: Any = None) -> Any:
        if _is_int(linecount):
            _check_size(linecount, "batch")
        return batch(value, linecount, fill_with)

    def f_slice(value: Any, slices: int, fill_with: Any = None) -> Any:
        if _is_int(slices):
            _check_size(slices, "slice")
        return slice_(value, slices, fill_with)

    def f_format(value: Any, *args: Any, **kwargs: Any) -> Any:
        check_percent_format(str(value))
        return fmt(value, *args, **kwargs)

    def f_replace(eval_ctx: Any, s: Any, old: Any, new: Any, count: Any = None) -> Any:
        _check_size(_replaced_size(str(s), old, new, -1 if count is None else count), "replace")
        return replace(eval_ctx, s, old, new, count)

    def f_join(eval_ctx: Any, value: Any, d: str = "", attribute: Any = None) -> Any:
        if attribute is None:
            value = _take(value, "join")
            _check_size(_joined_size(str(d), value), "join")
        return join(eval_ctx, value, d, attribute)

    # Keep jinja's calling conventions (replace and join get the evaluation context).
    for wrapper, original in ((f_replace, replace), (f_join, join)):
        wrapper.jinja_pass_arg = original.jinja_pass_arg  # type: ignore[attr-defined]
    return {"center": f_center, "indent": f_indent, "batch": f_batch, "slice": f_slice,
            "format": f_format, "replace": f_replace, "join": f_join}


class MemoryCap:
    """While active, the process may allocate at most RENDER_MEMORY more bytes (its
    ``RLIMIT_DATA`` is lowered to what it uses now plus that): the last line of defence for
    what the checks above do not foresee, such as ``str()`` of a list holding a long string a
    million times. Past it an allocation fails with MemoryError instead of the machine running
    out of memory. Re-entrant; a no-op where the limit cannot be read or set."""

    MEASURE_EVERY = 0.1  # seconds: what the process uses is read again at most this often

    def __init__(self) -> None:
        self._depth = 0
        self._saved: tuple[int, int] | None = None
        # Reading /proc costs 7 us, more than a small rendering: the figure is reused for
        # MEASURE_EVERY (the index grows by megabytes in that time, not gigabytes).
        self._used = 0
        self._measured = -math.inf

    def __enter__(self) -> MemoryCap:
        self._depth += 1
        if self._depth == 1:
            try:
                soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
                now = time.monotonic()
                if now - self._measured > self.MEASURE_EVERY:
                    self._used, self._measured = _data_bytes(), now
                cap = self._used + RENDER_MEMORY
                if hard != resource.RLIM_INFINITY:
                    cap = min(cap, hard)
                if soft == resource.RLIM_INFINITY or cap < soft:
                    resource.setrlimit(resource.RLIMIT_DATA, (cap, hard))
                    self._saved = (soft, hard)
            except (OSError, ValueError):
                self._saved = None
        return self

    def __exit__(self, *exc: object) -> None:
        self._depth -= 1
        if self._depth == 0 and self._saved is not None:
            resource.setrlimit(resource.RLIMIT_DATA, self._saved)
            self._saved = None


def _data_bytes() -> int:
    """The process's data + stack size, what RLIMIT_DATA is checked against (at least)."""
    with open("/proc/self/statm", "rb") as f:
        return int(f.read().split()[5]) * os.sysconf("SC_PAGE_SIZE")


class _BoundedConcat(CodeGenerator):
    """``a ~ b`` compiles to a call of the environment's bounded join, not jinja's str_join."""

    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        self.write("environment.bounded_concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedSandbox(SandboxedEnvironment):
    """SandboxedEnvironment whose values stay under MAX_RENDERED characters/items and
    whose integers stay under MAX_INT_BITS bits (see the module docstring)."""

    code_generator_class = _BoundedConcat
    intercepted_binops = frozenset({"*", "**", "%", "+"})

    def __init__(self, **options: Any) -> None:
        super().__init__(**options)
        self.filters.update(_bounded_filters(self.filters))
        self.globals.pop("lipsum", None)  # lorem ipsum of any length: no use in a URL

    def bounded_concat(self, values: Iterable[Any]) -> str:
        parts = [v if isinstance(v, str) else str(v) for v in values]
        _check_size(sum(map(len, parts)), "concatenation")
        return "".join(parts)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "**" and _is_int(left) and _is_int(right):
            if right > 0 and max(left.bit_length(), 1) * right > MAX_INT_BITS:
                _refuse("power result too large")
        elif operator == "*":
            if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_INT_BITS:
                _refuse("product too large")
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, _SIZED) and _is_int(n):
                    _check_size(len(seq) * n, "repetition")
        elif operator == "+":
            if isinstance(left, _SIZED) and isinstance(right, _SIZED):
                _check_size(len(left) + len(right), "concatenation")
        elif operator == "%" and isinstance(left, str):
            check_percent_format(left)
        return super().call_binop(context, operator, left, right)

    def wrap_str_format(self, value: Any) -> Any:
        wrapper = super().wrap_str_format(value)
        if wrapper is not None:  # str.format / format_map: the format string is known now
            check_brace_format(value.__self__)
        return wrapper

    def call(__self, __context: Any, __obj: Any, *args: Any, **kwargs: Any) -> Any:
        owner = getattr(__obj, "__self__", None)
        if isinstance(__obj, types.BuiltinMethodType) and isinstance(owner, str | bytes):
            args = _check_str_method(owner, __obj.__name__, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)
