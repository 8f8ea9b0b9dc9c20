"""Version 1 reference sets: ``templates``, ``gen`` and ``refs``, rendered with jinja2's
SandboxedEnvironment (reference files are untrusted).

``gen`` blocks can have millions of products (one per chunk), so each jinja string is
first compiled to a *column plan* when its syntax allows: literal text, dimension
variables, plain templates and integer arithmetic on them are evaluated for a whole batch
of products at once with numpy and Arrow string kernels. Anything else (filters, calls of
template functions, conditionals...) is rendered per product by the sandbox, under a
watchdog so a template cannot run for ever.

What a set makes is bounded before it is made where that can be known: the products of an
entry (``max_keys``), and the bytes of its keys from their templates' fixed text
(``max_generated``, ``max_key_length``). The rest is counted as it is made: batches of products
are sized in bytes, their keys checked and counted a batch at a time, a rendering as it ends.
"""

from __future__ import annotations

import math
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import ijson
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from jinja2 import StrictUndefined, TemplateError, nodes
from jinja2.sandbox import SecurityError

from ..lru import LRU
from .index import IndexBuilder, generated_why, key_too_long
from .jsonparse import Opener, json_error
from .limits import DEFAULT_LIMITS, JsonReader, Limits
from .model import INT64_MAX, ReferenceSetError
from .sandbox import MAX_RENDERED, RENDER_MEMORY, BoundedSandbox, MemoryCap

RENDER_SECONDS = 2.0  # one template rendering may take at most this long
GEN_BATCH = 1 << 18  # most products evaluated in one batch
GEN_BATCH_BYTES = 16 << 20  # bytes of keys and URLs one batch of products is sized to make
FIRST_RENDERED_BATCH = 1024  # products of a first batch whose sizes only rendering tells
URL_CACHE_BYTES = 16 << 20  # rendered refs URLs kept for reuse
INT_TEXT = 20  # characters of an int64 as text
INT_RENDERING = 1024  # characters a rendered offset or length may have


class RenderBudget:
    """The CPU seconds all template renderings of one set may take together (the limit
    ``max_template_seconds``): each rendering is bounded by the watchdog, but a set of many
    distinct templates, or a ``gen`` rendered product by product, adds them up. Time is
    counted while ``running`` (re-entrant: a batch of renderings is measured once)."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spent = 0.0
        self._since: float | None = None

    @contextmanager
    def running(self) -> Iterator[None]:
        if self._since is not None:
            yield
            return
        self._since = time.thread_time()
        try:
            yield
        finally:
            self.spent += time.thread_time() - self._since
            self._since = None

    @property
    def active(self) -> bool:
        return self._since is not None

    def used(self) -> float:
        """CPU seconds spent so far, the rendering under way included."""
        running = time.thread_time() - self._since if self._since is not None else 0.0
        return self.spent + running

    def exceeded(self) -> bool:
        return self.used() > self.seconds

    def message(self) -> str:
        return (f"the set's templates take more than {self.seconds:g} CPU seconds to render in all "
                f"(limit max_template_seconds={self.seconds:g})")


class _Watchdog:
    """Interrupts a rendering that runs longer than RENDER_SECONDS, or past the set's
    RenderBudget (SIGALRM, main thread)."""

    def __init__(self, budget: RenderBudget) -> None:
        self.started: float | None = None
        self.budget = budget

    def _tick(self, signum: int, frame: Any) -> None:
        if self.started is None:
            return
        if time.monotonic() - self.started > RENDER_SECONDS:
            self.started = None
            raise TimeoutError(f"template rendering took longer than {RENDER_SECONDS:g} s")
        if self.budget.exceeded():
            self.started = None
            raise TimeoutError(self.budget.message())

    @contextmanager
    def armed(self) -> Iterator[_Watchdog]:
        try:
            old = signal.signal(signal.SIGALRM, self._tick)
        except ValueError:  # not the main thread: no watchdog available
            yield self
            return
        signal.setitimer(signal.ITIMER_REAL, 0.2, 0.2)
        try:
            yield self
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0, 0)
            signal.signal(signal.SIGALRM, old)


def _bounded(template: Any, context: dict[str, Any]) -> str:
    """Render as a stream and stop at MAX_RENDERED characters, so that a loop of large
    outputs is refused before it takes the memory, not after."""
    parts: list[str] = []
    size = 0
    for chunk in template.generate(context):
        size += len(chunk)
        if size > MAX_RENDERED:
            raise SecurityError(f"rendered text longer than {MAX_RENDERED} characters")
        parts.append(chunk)
    return "".join(parts)


class TemplateSet:
    """The ``templates`` section: plain strings are variables, strings containing
    ``{{`` become functions called with keyword arguments (``{{f(c='text')}}``)."""

    def __init__(self, templates: dict[str, Any], name: str, watchdog: _Watchdog) -> None:
        self.env = BoundedSandbox(undefined=StrictUndefined, autoescape=False)
        self.name = name
        self.watchdog = watchdog
        self.budget = watchdog.budget
        self.plain: dict[str, str] = {}
        self.context: dict[str, Any] = {}
        for key, value in templates.items():
            if not isinstance(value, str):
                raise ReferenceSetError(f"{name}: templates.{key} must be a string")
            if "{{" in value or "{%" in value:
                template = self.compile(value, f"templates.{key}")
                self.context[key] = self._function(template, key)
            else:
                self.plain[key] = value
                self.context[key] = value
        self._url_cache: LRU[str, str] = LRU(100_000, max_weight=URL_CACHE_BYTES, weigh=len)
        self.memory_cap = MemoryCap()

    def _function(self, template: Any, key: str) -> Callable[..., str]:
        def call(**kwargs: Any) -> str:
            return _bounded(template, kwargs)

        call.__name__ = key
        return call

    def compile(self, source: str, where: str) -> Any:
        try:
            return self.env.from_string(source)
        except TemplateError as e:
            raise ReferenceSetError(f"{self.name}: {where}: bad template: {e}") from None

    def render(self, template: Any, context: dict[str, Any], where: str) -> str:
        with self.rendering(where):
            return self._render(template, context, where)

    @contextmanager
    def rendering(self, where: str) -> Iterator[None]:
        """Renderings inside count against the set's RenderBudget; refused once past it
        (checked when the outermost ``rendering`` ends, and by the watchdog meanwhile)."""
        outer = not self.budget.active
        with self.budget.running():
            yield
        if outer and self.budget.exceeded():
            raise ReferenceSetError(f"{self.name}: {where}: {self.budget.message()}")

    def _render(self, template: Any, context: dict[str, Any], where: str) -> str:
        self.watchdog.started = time.monotonic()
        try:
            with self.memory_cap:
                out = _bounded(template, context)
        except SecurityError as e:
            raise ReferenceSetError(f"{self.name}: {where}: template refused by sandbox: {e}") from None
        except MemoryError:
            raise ReferenceSetError(
                f"{self.name}: {where}: template refused: it needs more than "
                f"{RENDER_MEMORY >> 30} GiB of memory") from None
        except TimeoutError as e:
            if self.budget.exceeded():
                raise ReferenceSetError(f"{self.name}: {where}: {self.budget.message()}") from None
            raise ReferenceSetError(f"{self.name}: {where}: template failed: {e}") from None
        except (TemplateError, ArithmeticError, TypeError, ValueError) as e:
            raise ReferenceSetError(f"{self.name}: {where}: template failed: {e}") from None
        finally:
            self.watchdog.started = None
        return out

    def render_url(self, url: str) -> str:
        """A ``refs`` URL with templates applied (cached: many refs share a URL)."""
        if "{{" not in url and "{%" not in url:
            return url
        out = self._url_cache.get(url)
        if out is None:
            out = self.render(self.compile(url, f"url {url[:60]!r}"), self.context, "refs url")
            self._url_cache.put(url, out)
        return out


# ---- column plans for gen ----------------------------------------------------------------

Column = np.ndarray | str | int  # a per-product array, or a constant
Contexts = Callable[[], Iterator[dict]]  # per-product jinja contexts, for the fallback

_ARITH = {
    nodes.Add: np.add,
    nodes.Sub: np.subtract,
    nodes.Mul: np.multiply,
    nodes.FloorDiv: np.floor_divide,
    nodes.Mod: np.mod,
}
_SAFE = 2**62


class _NotVectorizable(Exception):
    pass


def _eval(node: nodes.Node, dims: dict[str, np.ndarray], plain: dict[str, str]) -> Column:
    if isinstance(node, nodes.Name):
        if node.name in dims:
            return dims[node.name]
        if node.name in plain:
            return plain[node.name]
        raise _NotVectorizable
    if isinstance(node, nodes.Const) and isinstance(node.value, int | str) and not isinstance(
        node.value, bool
    ):
        return node.value
    if isinstance(node, nodes.Neg | nodes.Pos):
        v = _eval(node.node, dims, plain)
        if isinstance(v, str):
            raise _NotVectorizable
        return -v if isinstance(node, nodes.Neg) else v
    op = _ARITH.get(type(node))
    if op is not None:
        a, b = _eval(node.left, dims, plain), _eval(node.right, dims, plain)  # type: ignore[attr-defined]
        if isinstance(a, str) or isinstance(b, str):
            raise _NotVectorizable
        if op in (np.floor_divide, np.mod) and np.any(np.asarray(b) == 0):
            raise _NotVectorizable  # let jinja report the division by zero
        # Guard against int64 overflow: check magnitudes in float first.
        fa = np.abs(np.asarray(a, dtype=np.float64)).max(initial=0)
        fb = np.abs(np.asarray(b, dtype=np.float64)).max(initial=0)
        if fa > _SAFE or fb > _SAFE or (op is np.multiply and fa * fb > _SAFE):
            raise _NotVectorizable
        return op(np.asarray(a, np.int64), np.asarray(b, np.int64))
    raise _NotVectorizable


@dataclass(frozen=True)
class Room:
    """What the renderings of one field for a batch of products may make: ``each``
    characters a product, ``total`` for the batch (checked as each is rendered)."""

    each: int
    total: int
    each_why: str  # "is longer than ... (limit ...)": a rendering longer than ``each``
    total_why: str  # the same for a batch past ``total``
    what: str = "rendering"  # what a rendering is, in a refusal ("key")


class _Plan:
    """A jinja string compiled either to parts evaluated on columns, or to a template."""

    def __init__(self, source: str, templates: TemplateSet, dim_names: list[str], where: str):
        self.source = source
        self.where = where
        self.templates = templates
        self.template = templates.compile(source, where)  # also validates the syntax
        self.parts: list[nodes.Node] | None = None
        tree = templates.env.parse(source)
        body = tree.body
        if not body:
            self.parts = []
        elif len(body) == 1 and isinstance(body[0], nodes.Output):
            self.parts = list(body[0].nodes)
        for part in self.parts or []:
            if not isinstance(part, nodes.TemplateData) and not _names_ok(part, dim_names, templates):
                self.parts = None
                break
        # Output at the top level of the template is rendered for every product, whatever
        # else the template does: its fixed text is in every rendering.
        self.fixed = [n for out in body if isinstance(out, nodes.Output) for n in out.nodes]
        if any(tree.find_all(nodes.Extends)):  # a child template renders its blocks only
            self.fixed = []
        self.dim_names = set(dim_names)
        self.constant = not any(n.name in self.dim_names for n in tree.find_all(nodes.Name))

    def shortest(self) -> int:
        """Characters every rendering has at least, known before any is made: the fixed
        text, the plain templates and constants at the top level (a value of a dimension
        or of an expression: at least one character)."""
        return sum(self._length(n, None) for n in self.fixed)

    def longest(self, dims: dict[str, Dimension]) -> int | None:
        """Characters a product's column-evaluated string has at most (None: rendered per
        product, its length known only then)."""
        if self.parts is None:
            return None
        return sum(self._length(n, dims) for n in self.parts)

    def _length(self, node: nodes.Node, dims: dict[str, Dimension] | None) -> int:
        """A node's rendered length: the least (``dims`` None) or the most."""
        if isinstance(node, nodes.TemplateData):
            return len(node.data)
        if isinstance(node, nodes.Const) and isinstance(node.value, int | str):
            return len(str(node.value))
        if isinstance(node, nodes.Name) and node.name in self.templates.plain:
            return len(self.templates.plain[node.name])
        if dims is None:
            return 1 if isinstance(node, nodes.Name) and node.name in self.dim_names else 0
        if isinstance(node, nodes.Name) and node.name in dims:
            return dims[node.name].text_length()
        return INT_TEXT  # integer arithmetic on columns: an int64

    def columns(self, dims: dict[str, np.ndarray], n: int) -> list[Column] | None:
        if self.parts is None:
            return None
        out: list[Column] = []
        try:
            for part in self.parts:
                if isinstance(part, nodes.TemplateData):
                    out.append(part.data)
                else:
                    out.append(_eval(part, dims, self.templates.plain))
        except _NotVectorizable:
            return None
        return out

    def strings(self, dims: dict[str, np.ndarray], n: int, contexts: Contexts,
                room: Room) -> pa.Array:
        cols = self.columns(dims, n)
        if cols is None:
            return pa.array(self._rendered(contexts, room), pa.large_string())
        pieces: list[Any] = []
        for c in cols:
            if isinstance(c, np.ndarray):
                pieces.append(pa.array(c).cast(pa.large_string()))
            else:
                pieces.append(pa.scalar(str(c), pa.large_string()))
        if not pieces:
            return pa.array([""] * n, pa.large_string())
        if all(isinstance(p, pa.Scalar) for p in pieces):
            return pa.array(["".join(p.as_py() for p in pieces)] * n, pa.large_string())
        return pc.binary_join_element_wise(*pieces, pa.scalar("", pa.large_string()))

    def _rendered(self, contexts: Contexts, room: Room) -> list[str]:
        """Each product rendered by the sandbox, refused as soon as one rendering, or the
        batch's, passes ``room``."""
        render = self.templates.render
        out: list[str] = []
        total = 0
        # The memory cap is set and the budget measured once for the batch, not per product.
        with self.templates.rendering(self.where), self.templates.memory_cap:
            for ctx in contexts():
                text = render(self.template, ctx, self.where)
                total += len(text)
                if len(text) > room.each:
                    shown = repr(text if len(text) <= 80 else text[:77] + "...")
                    raise ReferenceSetError(
                        f"{self.templates.name}: {self.where}: {room.what} {shown} {room.each_why}")
                if total > room.total:
                    raise ReferenceSetError(f"{self.templates.name}: {self.where}: {room.total_why}")
                out.append(text)
        return out

    def integers(self, dims: dict[str, np.ndarray], n: int, contexts: Contexts) -> np.ndarray:
        cols = self.columns(dims, n)
        if cols is not None:
            cleaned = [c for c in cols if not (isinstance(c, str) and not c.strip())]
            if len(cleaned) == 1 and not isinstance(cleaned[0], str):
                return np.broadcast_to(np.asarray(cleaned[0], np.int64), (n,))
        why = f"is longer than {INT_RENDERING} characters: not an integer"
        text = self.strings(dims, n, contexts, Room(INT_RENDERING, INT_RENDERING * n, why, why))
        try:
            return pc.cast(pc.utf8_trim_whitespace(text), pa.int64()).to_numpy()
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            bad = next((s for s in text.to_pylist() if not _is_int(s)), None)
            if bad is None:  # integers, but beyond 64 bits
                raise ReferenceSetError(
                    f"{self.templates.name}: {self.where} renders an integer beyond 64 bits"
                ) from None
            raise ReferenceSetError(
                f"{self.templates.name}: {self.where} must render an integer, got {bad[:40]!r}"
            ) from None


def _is_int(s: str) -> bool:
    try:
        int(s)
    except ValueError:
        return False
    return True


def _names_ok(node: nodes.Node, dim_names: list[str], templates: TemplateSet) -> bool:
    """True when every name in the expression is a dimension or a plain template."""
    for name in node.find_all(nodes.Name):
        if name.name not in dim_names and name.name not in templates.plain:
            return False
    return not any(node.find_all(nodes.Call)) and not any(node.find_all(nodes.Filter))


@dataclass(frozen=True)
class Dimension:
    """One dimension of a ``gen`` entry: its length, and its values at given positions
    computed when asked. A ``{start, stop, step}`` range is never materialised (its length
    can be 2^64); an explicit list is as long as the JSON that holds it."""

    length: int
    start: int = 0
    step: int = 1
    listed: np.ndarray | None = None

    @classmethod
    def parse(cls, name: str, where: str, spec: Any) -> Dimension:
        if isinstance(spec, list):
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in spec):
                raise ReferenceSetError(f"{name}: {where} must be a list of integers")
            if any(abs(v) > INT64_MAX for v in spec):
                raise ReferenceSetError(f"{name}: {where}: values out of range")
            return cls(len(spec), listed=np.asarray(spec, dtype=np.int64))
        if isinstance(spec, dict):
            unknown = set(spec) - {"start", "stop", "step"}
            if unknown:
                raise ReferenceSetError(f"{name}: {where} has unknown fields {sorted(unknown)}")
            if "stop" not in spec:
                raise ReferenceSetError(f"{name}: {where} needs 'stop'")
            start, stop, step = spec.get("start", 0), spec["stop"], spec.get("step", 1)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, stop, step)):
                raise ReferenceSetError(f"{name}: {where}: start/stop/step must be integers")
            if step == 0:
                raise ReferenceSetError(f"{name}: {where}: step must not be 0")
            if any(abs(v) > INT64_MAX for v in (start, stop, step)):
                raise ReferenceSetError(f"{name}: {where}: values out of range")
            return cls(range_length(start, stop, step), start, step)
        raise ReferenceSetError(f"{name}: {where} must be {{start, stop, step}} or a list")

    def text_length(self) -> int:
        """The most characters a value has as text."""
        if self.length == 0:
            return 0
        if self.listed is not None:
            ends = (int(self.listed.min()), int(self.listed.max()))
        else:
            ends = (self.start, self.start + (self.length - 1) * self.step)
        return max(len(str(v)) for v in ends)

    def at(self, positions: np.ndarray) -> np.ndarray:
        """The values at ``positions`` (int64, each below ``length``)."""
        if self.listed is not None:
            return self.listed[positions]
        # start + step * position in wrapping int64 arithmetic: the true result is a value of
        # the range, which fits in 64 bits, so the wrapped one is exact.
        return np.int64(self.start) + np.int64(self.step) * positions.astype(np.int64)


def range_length(start: int, stop: int, step: int) -> int:
    """``len(range(start, stop, step))`` for any size (``len`` fails beyond 2^63 - 1)."""
    if step > 0:
        return max(0, (stop - start + step - 1) // step)
    return max(0, (start - stop - step - 1) // -step)


class GenEntry:
    """One ``gen`` entry, validated, its number of products known before any is made."""

    def __init__(self, entry: Any, i: int, templates: TemplateSet) -> None:
        name = templates.name
        where = self.where = f"gen[{i}]"
        self.templates = templates
        if not isinstance(entry, dict):
            raise ReferenceSetError(f"{name}: {where} must be an object")
        unknown = set(entry) - {"key", "url", "offset", "length", "dimensions"}
        if unknown:
            raise ReferenceSetError(f"{name}: {where} has unknown fields {sorted(unknown)}")
        for req in ("key", "url", "dimensions"):
            if req not in entry:
                raise ReferenceSetError(f"{name}: {where} needs '{req}'")
        if ("offset" in entry) != ("length" in entry):
            have, missing = ("offset", "length") if "offset" in entry else ("length", "offset")
            raise ReferenceSetError(
                f"{name}: {where} has '{have}' but no '{missing}' (give both or neither)")
        for field in ("key", "url", "offset", "length"):
            if field in entry and not isinstance(entry[field], str | int):
                raise ReferenceSetError(f"{name}: {where}.{field} must be a string")
        dims_spec = entry["dimensions"]
        if not isinstance(dims_spec, dict) or not dims_spec:
            raise ReferenceSetError(f"{name}: {where}.dimensions must be a non-empty object")
        clash = set(dims_spec) & set(templates.context)
        if clash:
            raise ReferenceSetError(
                f"{name}: {where}: dimension {sorted(clash)[0]!r} shadows a template")
        self.dims = {k: Dimension.parse(name, f"{where}.dimensions.{k}", v)
                     for k, v in dims_spec.items()}
        self.shape = [d.length for d in self.dims.values()]
        self.products = math.prod(self.shape)  # a Python int: exact however large
        names = list(self.dims)
        self.plans = {
            f: _Plan(str(entry[f]), templates, names, f"{where}.{f}")
            for f in ("key", "url", "offset", "length")
            if f in entry
        }

    def longest(self) -> int | None:
        """Characters of a product's key and URL together at most, when both are evaluated
        on columns (None: one of them is rendered per product)."""
        key, url = (self.plans[f].longest(self.dims) for f in ("key", "url"))
        return None if key is None or url is None else key + url

    def expand(self, builder: IndexBuilder) -> None:
        """Add the entry's references a batch at a time, each batch sized to make about
        GEN_BATCH_BYTES of keys and URLs: from their longest text when it is known before
        rendering, else from what the batch before made (the first: FIRST_RENDERED_BATCH
        products). Keys are checked against ``max_key_length``, and keys and URLs counted
        against ``max_generated``, a batch at a time — renderings as each is made."""
        templates, names, dims = self.templates, list(self.dims), list(self.dims.values())
        total, plans = self.products, self.plans
        where = f"{templates.name}: {self.where}"
        max_len = builder.limits.max_key_length
        each_key = max_len if builder.bad_keys == "error" else MAX_RENDERED
        too_long = key_too_long(max_len)
        if self.plans["key"].shortest() > max_len:  # bad_keys=skip (else refused before)
            builder.skip_all(f"{self.where}: every one of its {total:,} keys {too_long}", total)
            return
        known = self.longest()
        n_next = FIRST_RENDERED_BATCH if known is None else _batch_for(known)
        start = 0
        while start < total:
            stop = min(start + n_next, total)
            n = stop - start
            flat = np.arange(start, stop, dtype=np.int64)
            idx = np.unravel_index(flat, self.shape)  # C order: the last dimension varies fastest
            cols = {k: dims[j].at(idx[j]) for j, k in enumerate(names)}

            def contexts(cols: dict[str, np.ndarray] = cols, n: int = n) -> Iterator[dict]:
                base = dict(templates.context)
                lists = {k: v.tolist() for k, v in cols.items()}
                for r in range(n):
                    for k in names:
                        base[k] = lists[k][r]
                    yield base

            room = builder.room()
            left = sys.maxsize if room is None else room
            why = generated_why(builder.limits.max_generated)
            keys = plans["key"].strings(cols, n, contexts, Room(each_key, left, too_long, why, "key"))
            key_lengths = pc.binary_length(keys)
            key_bytes = pc.sum(key_lengths).as_py() or 0
            urls = plans["url"].strings(cols, n, contexts,
                                        Room(MAX_RENDERED, max(left - key_bytes, 0), "", why))
            if "offset" in plans:
                offsets = plans["offset"].integers(cols, n, contexts)
                lengths = plans["length"].integers(cols, n, contexts)
            else:
                offsets = lengths = None
            made = (pc.max(key_lengths).as_py() or 0) + (pc.max(pc.binary_length(urls)).as_py() or 0)
            builder.add_columns(keys, urls, offsets, lengths, where=where)
            start = stop
            n_next = _batch_for(max(made, known or 0))


def _batch_for(product_bytes: int) -> int:
    """Products a batch may have when each makes up to ``product_bytes`` of key and URL."""
    return max(1, min(GEN_BATCH, GEN_BATCH_BYTES // max(product_bytes, 1)))


def check_generated(name: str, entries: list[GenEntry], before: int, limits: Limits,
                    bad_keys: str) -> None:
    """Refuse, before anything is generated, an entry whose keys are all longer than
    ``max_key_length``, or whose keys' fixed text alone (times its products, with the
    ``before`` bytes of keys and URLs already made) comes to more than ``max_generated``."""
    total = before
    for e in entries:
        if not e.products:
            continue
        key, url = e.plans["key"], e.plans["url"]
        shortest = key.shortest()
        if shortest > limits.max_key_length:
            if bad_keys == "error":
                raise ReferenceSetError(
                    f"{name}: {e.where}.key: every key {key_too_long(limits.max_key_length)}")
            continue  # bad_keys=skip: every key is dropped as its batch is made, none kept
        prior = total
        total += e.products * shortest + (url.shortest() if url.constant else 0)
        if total > limits.max_generated:
            so_far = f" (with the {prior:,} bytes before it)" if prior else ""
            raise ReferenceSetError(
                f"{name}: {e.where}: {e.products:,} keys of at least {shortest:,} bytes"
                f"{so_far}: {generated_why(limits.max_generated)}")


def check_key_count(name: str, entries: list[GenEntry], before: int, max_keys: int) -> None:
    """Refuse, before anything is generated, entries whose products together with the
    ``before`` keys already read come to more than ``max_keys``."""
    total = before
    for e in entries:
        prior, total = total, total + e.products
        if total > max_keys:
            so_far = f" ({total:,} keys with the {prior:,} before it)" if prior else ""
            raise ReferenceSetError(
                f"{name}: {e.where} has {e.products:,} products, a key each{so_far}: more keys "
                f"than a set may have (limit max_keys={max_keys})")


def _read_section(open_stream: Opener, name: str, prefix: str, backend: Any, limits: Limits) -> Any:
    with open_stream() as f:
        try:
            for value in backend.items(JsonReader(f, name, limits), prefix, use_float=True):
                return value
        except ijson.JSONError as e:
            raise json_error(name, e) from None
    return None


def _refs_must_be_an_object(open_stream: Opener, name: str, backend: Any, limits: Limits) -> None:
    """Raise unless 'refs' is absent or an object (only 'gen' may then make references)."""
    with open_stream() as f:
        try:
            for prefix, event, _ in backend.parse(JsonReader(f, name, limits)):
                if prefix == "refs":
                    if event != "start_map":
                        raise ReferenceSetError(f"{name}: 'refs' must be an object of key: reference")
                    return
        except ijson.JSONError as e:
            raise json_error(name, e) from None


def read_v1(open_stream: Opener, name: str, builder: IndexBuilder, backend: Any = ijson,
            limits: Limits = DEFAULT_LIMITS) -> None:
    version = _read_section(open_stream, name, "version", backend, limits)
    if version not in (0, 1) or isinstance(version, bool):
        raise ReferenceSetError(f"{name}: unsupported reference set version {version!r} (expected 1, "
                                "or 0 with only 'refs')")
    raw_templates = _read_section(open_stream, name, "templates", backend, limits) or {}
    if not isinstance(raw_templates, dict):
        raise ReferenceSetError(f"{name}: 'templates' must be an object")
    gen = _read_section(open_stream, name, "gen", backend, limits) or []
    if not isinstance(gen, list):
        raise ReferenceSetError(f"{name}: 'gen' must be a list")
    if version == 0 and (raw_templates or gen):
        # {"version": 0, "refs": {...}}: a Version 0 set wrapped as kerchunk writes it
        raise ReferenceSetError(f"{name}: version 0 has no 'templates' or 'gen' (those are Version 1's)")
    watchdog = _Watchdog(RenderBudget(limits.max_template_seconds))
    with watchdog.armed():
        templates = TemplateSet(raw_templates, name, watchdog)
        entries = [GenEntry(entry, i, templates) for i, entry in enumerate(gen)]
        check_key_count(name, entries, 0, limits.max_keys)  # refused before any work
        check_generated(name, entries, 0, limits, builder.bad_keys)
        builder.bound_generated(name)
        with open_stream() as f:
            try:
                add = builder.add_value
                render = templates.render_url
                n = 0
                for key, value in backend.kvitems(JsonReader(f, name, limits), "refs", use_float=True):
                    add(key, value, render)
                    n += 1
            except ijson.JSONError as e:
                raise json_error(name, e) from None
        if n == 0:  # kvitems yields nothing for a 'refs' that is not an object: say so
            _refs_must_be_an_object(open_stream, name, backend, limits)
        check_key_count(name, entries, builder.keys_read, limits.max_keys)
        builder.flush()  # the last keys of refs counted
        check_generated(name, entries, builder.generated, limits, builder.bad_keys)
        for entry in entries:
            entry.expand(builder)


__all__ = ["Dimension", "GenEntry", "RenderBudget", "Room", "TemplateSet", "check_generated",
           "check_key_count", "range_length", "read_v1"]
