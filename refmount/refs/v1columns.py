"""A ``gen`` string made for a batch of products at once: ``gen`` blocks can have millions
of products (one per chunk), so each jinja string is first compiled to a *column plan* when
its syntax allows: literal text, dimension variables, plain templates and integer arithmetic
on them are evaluated for a whole batch of products at once with numpy and Arrow string
kernels. Anything else (filters, calls of template functions, conditionals...) is rendered
per product by the sandbox (``v1templates.py``), within the ``Room`` a batch has. The
dimensions (``Dimension``) give the columns, a ``{start, stop, step}`` range never
materialised."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from jinja2 import nodes

from refmount.refs.model import INT64_MAX, ReferenceSetError
from refmount.refs.v1templates import TemplateSet

INT_TEXT = 20  # characters of an int64 as text
INT_RENDERING = 1024  # characters a rendered offset or length may have

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


class Plan:
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
