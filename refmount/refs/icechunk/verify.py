"""A schema-driven verifier of flatbuffers, vectorised with numpy.

The Python flatbuffers runtime trusts every offset it follows (a hostile buffer gives an
IndexError, a struct.error, or garbage). :func:`verify` checks a buffer against a
:class:`Table` description (schema.py) before any field of it is read: every table, its
vtable and each described field lie within the buffer and within the table; every offset
lands within the buffer; every vector's and string's length fits in what follows it;
required fields are present; union types are known. The checks run on numpy arrays of
positions, all the tables of one kind at once, so a manifest of a million chunk references
is verified in well under a second.

Bounds: the schema is not recursive, so the verification's depth is that of the schema;
the offsets followed to tables and strings inside vectors are at most a quarter of the
buffer's size in all (an honest buffer stores each in 4 bytes of its own), so vectors that
overlap to multiply the work are refused; every vector's element count is bounded by the
bytes left after it.

What it returns (:class:`Tables`) holds the positions it found, so the reader gathers the
fields of many tables at once from it (manifest.py) or hands single tables to the accessors
that flatc generated (fbs/).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from refmount.refs.icechunk.errors import IcechunkError

SLICE = 1 << 16

Kind = Literal["scalar", "struct", "string", "vector", "table", "tables", "strings", "union"]
OFFSET_KINDS = ("string", "vector", "table", "tables", "strings", "union")


@dataclass(frozen=True)
class Field:
    slot: int  # the field's id: its vtable entry is at 4 + 2 * slot
    kind: Kind
    size: int = 0  # scalar or struct: its size; vector: the size of one element
    required: bool = False
    table: Table | None = None  # "table" and "tables": what the targets are
    union: dict[int, Table] | None = None  # "union": type value -> table (the type field is slot - 1)


@dataclass(frozen=True)
class Table:
    name: str
    fields: dict[str, Field]
    # exactly one of these fields ("a|b": a or b) is present in every table (a union spelt
    # as optional fields)
    exactly_one: tuple[str, ...] = ()
    # when set, only these fields' results are kept (and the tables' positions): a vector of
    # many such tables is verified SLICE tables at a time, in memory bounded by the slice
    keep: tuple[str, ...] | None = None


@dataclass
class Vectors:
    """One vector (or string) field of N tables: where each one's elements start (-1: the field
    is absent) and how many there are. For vectors of tables or strings, ``items`` are the
    elements of all N vectors one after the other (``first[i]``: where table i's begin)."""

    start: np.ndarray
    length: np.ndarray
    first: np.ndarray | None = None
    items: Tables | Vectors | None = None


@dataclass
class Union:
    type: np.ndarray  # per table: the union's type value (0: none)
    row: np.ndarray  # per table: its index in members[type]
    members: dict[int, Tables] = field(default_factory=dict)


@dataclass
class Tables:
    """N verified tables of one kind."""

    table: Table
    pos: np.ndarray  # int64, the tables' positions
    vt: np.ndarray  # their vtables' positions
    vtsize: np.ndarray
    fields: dict[str, np.ndarray] = field(default_factory=dict)  # scalar/struct: position, -1 absent
    children: dict[str, Tables | Vectors | Union] = field(default_factory=dict)
    rows: dict[str, np.ndarray] = field(default_factory=dict)  # "table": index in children (-1 absent)

    def __len__(self) -> int:
        return len(self.pos)


class _Verifier:
    def __init__(self, data: bytes | bytearray, name: str) -> None:
        self.u8 = np.frombuffer(data, np.uint8)
        self.n = len(data)
        self.name = name
        self.budget = self.n // 4 + 16

    def fail(self, what: str) -> IcechunkError:
        return IcechunkError(f"{self.name}: malformed flatbuffer: {what}")

    # little-endian gathers at positions already checked to be in range
    def u16(self, p: np.ndarray) -> np.ndarray:
        u8 = self.u8
        return u8[p].astype(np.int64) | (u8[p + 1].astype(np.int64) << 8)

    def u32(self, p: np.ndarray) -> np.ndarray:
        u8 = self.u8
        return (u8[p].astype(np.int64) | (u8[p + 1].astype(np.int64) << 8)
                | (u8[p + 2].astype(np.int64) << 16) | (u8[p + 3].astype(np.int64) << 24))

    def i32(self, p: np.ndarray) -> np.ndarray:
        v = self.u32(p)
        return np.where(v >= 1 << 31, v - (1 << 32), v)

    def spend(self, count: int, what: str) -> None:
        self.budget -= count
        if self.budget < 0:
            raise self.fail(f"more offsets to {what} than the buffer's size allows (overlapping vectors)")

    def follow(self, p: np.ndarray, what: str) -> np.ndarray:
        """The targets of the uoffsets at ``p`` (each checked to leave 4 bytes)."""
        t = p + self.u32(p)
        if t.size and int(t.max()) + 4 > self.n:
            raise self.fail(f"an offset to {what} points past the end of the buffer")
        return t

    def tables(self, pos: np.ndarray, table: Table) -> Tables:
        n = self.n
        pos = pos.astype(np.int64, copy=False)
        if pos.size and (int(pos.min()) < 0 or int(pos.max()) + 4 > n):
            raise self.fail(f"a {table.name} table lies outside the buffer")
        vt = pos - self.i32(pos)
        if vt.size and (int(vt.min()) < 0 or int(vt.max()) + 4 > n):
            raise self.fail(f"the vtable of a {table.name} table lies outside the buffer")
        vtsize = self.u16(vt)
        tsize = self.u16(vt + 2)
        if vt.size and ((vtsize < 4).any() or (vtsize & 1).any() or int((vt + vtsize).max()) > n
                        or int((pos + tsize).max()) > n or (tsize < 4).any()):
            raise self.fail(f"the vtable of a {table.name} table is inconsistent with the buffer")
        out = Tables(table, pos, vt, vtsize)
        for fname, f in table.fields.items():
            voff = 4 + 2 * f.slot
            has = vtsize >= voff + 2
            fo = np.zeros(len(pos), np.int64)
            if has.any():
                fo[has] = self.u16(vt[has] + voff)
            present = fo != 0
            what = f"{table.name}.{fname}"
            if f.required and not present.all():
                raise self.fail(f"required field {what} is missing")
            width = f.size if f.kind in ("scalar", "struct") else 4
            if (present & (fo + width > tsize)).any():
                raise self.fail(f"field {what} lies outside its table")
            fpos = np.where(present, pos + fo, -1)
            if f.kind in ("scalar", "struct"):
                out.fields[fname] = fpos
                continue
            idx = np.flatnonzero(present)
            if f.kind == "union":
                out.children[fname] = self.union(out, f, idx, fpos, what)
                continue
            target = np.full(len(pos), -1, np.int64)
            target[idx] = self.follow(fpos[idx], what)
            if f.kind == "table":
                assert f.table is not None
                self.spend(len(idx), what)
                rows = np.full(len(pos), -1, np.int64)
                rows[idx] = np.arange(len(idx))
                out.rows[fname] = rows
                out.children[fname] = self.tables(target[idx], f.table)
            else:
                out.children[fname] = self.vectors(target, f, what)
        if table.exactly_one:
            count = np.zeros(len(pos), np.int64)
            for names in table.exactly_one:
                present = np.zeros(len(pos), bool)
                for fname in names.split("|"):
                    child = out.children.get(fname)
                    present |= (child.start >= 0) if isinstance(child, Vectors) else (out.fields[fname] >= 0)
                count += present
            if (count != 1).any():
                raise self.fail(f"a {table.name} table that is not exactly one of "
                                f"{', '.join(n.replace('|', ' or ') for n in table.exactly_one)}")
        if table.keep is not None:
            out.vt = out.vtsize = np.zeros(0, np.int64)
            out.fields = {k: v for k, v in out.fields.items() if k in table.keep}
            out.children = {k: v for k, v in out.children.items() if k in table.keep}
        return out

    def vectors(self, target: np.ndarray, f: Field, what: str) -> Vectors:
        present = target >= 0
        length = np.zeros(len(target), np.int64)
        length[present] = self.u32(target[present])
        start = np.where(present, target + 4, -1)
        esize = {"string": 1, "vector": f.size, "tables": 4, "strings": 4}[f.kind]
        end = start + length * esize + (1 if f.kind == "string" else 0)
        if present.any() and int(end[present].max()) > self.n:
            raise self.fail(f"{what} is longer than the buffer")
        vec = Vectors(start, length)
        if f.kind in ("tables", "strings"):
            total = int(length.sum())
            self.spend(total, what)
            first = np.concatenate(([0], np.cumsum(length)[:-1])) if len(length) else length
            vec.first = first
            ends = first + length

            def targets(lo: int, hi: int) -> np.ndarray:  # elements lo..hi of all the vectors
                k = np.arange(lo, hi)
                owner = np.searchsorted(ends, k, side="right")
                return self.follow(start[owner] + 4 * (k - first[owner]), what)

            if f.kind == "tables":
                assert f.table is not None
                if f.table.keep is not None and total > SLICE:
                    vec.items = _concat([self.tables(targets(i, min(i + SLICE, total)), f.table)
                                         for i in range(0, total, SLICE)])
                else:
                    vec.items = self.tables(targets(0, total), f.table)
            else:
                vec.items = self.vectors(targets(0, total), Field(0, "string"), what)
        return vec

    def union(self, out: Tables, f: Field, idx: np.ndarray, fpos: np.ndarray, what: str) -> Union:
        assert f.union is not None
        voff = 4 + 2 * (f.slot - 1)
        has = out.vtsize >= voff + 2
        to = np.zeros(len(out.pos), np.int64)
        if has.any():
            to[has] = self.u16(out.vt[has] + voff)
        tsize = self.u16(out.vt + 2)
        if ((to != 0) & (to + 1 > tsize)).any():
            raise self.fail(f"the type of {what} lies outside its table")
        utype = np.zeros(len(out.pos), np.int64)
        tp = np.flatnonzero(to != 0)
        utype[tp] = self.u8[out.pos[tp] + to[tp]]
        value = np.zeros(len(out.pos), bool)
        value[idx] = True
        if (value & (utype == 0)).any() or (~value & (utype != 0)).any():
            raise self.fail(f"{what}: a union value without its type, or a type without its value")
        known = np.isin(utype, list(f.union)) | (utype == 0)
        if not known.all():
            raise self.fail(f"{what}: unknown union type {int(utype[~known][0])}")
        result = Union(utype, np.full(len(out.pos), -1, np.int64))
        for t, table in f.union.items():
            sel = np.flatnonzero(utype == t)
            self.spend(len(sel), what)
            result.row[sel] = np.arange(len(sel))
            result.members[t] = self.tables(self.follow(fpos[sel], what), table)
        return result


def _concat(parts: list[Tables]) -> Tables:
    """Slices of one vector's tables as one (their kept fields: scalars, structs, plain vectors)."""
    first = parts[0]
    out = Tables(first.table, np.concatenate([p.pos for p in parts]), first.vt, first.vtsize)
    for k in first.fields:
        out.fields[k] = np.concatenate([p.fields[k] for p in parts])
    for k, child in first.children.items():
        if not isinstance(child, Vectors) or child.items is not None:
            raise TypeError(f"{first.table.name}.{k}: only plain vectors are kept across slices")
        out.children[k] = Vectors(np.concatenate([p.children[k].start for p in parts]),  # type: ignore[union-attr]
                                  np.concatenate([p.children[k].length for p in parts]))  # type: ignore[union-attr]
    return out


def verify(data: bytes | bytearray, root: Table, name: str) -> Tables:
    """The root table of the flatbuffer ``data``, verified against ``root`` (one table)."""
    v = _Verifier(data, name)
    if v.n < 8:
        raise v.fail(f"{v.n} bytes, too short for a flatbuffer")
    return v.tables(v.follow(np.zeros(1, np.int64), "the root table"), root)
