"""Sets that meet refmount's bounds exactly (tests/security/test_bound_edges.py): for each bound a
set just under it and one just over, gathered in catalogues (list files) so that one mount and
one ``refmount serve`` exercise both sides of many bounds.

* ``lowered``: the bounds an option lowers (``max_inline``, ``max_keys``, ``max_key_length``,
  ``max_key_depth``, ``max_nesting``, ``max_source``, ``max_generated``,
  ``max_template_seconds``, ``max_open_memory``, ``max_sets``), every set within every other
  bound of the catalogue's options;
* ``at_code_values``: the bounds met at the code's value (the decoded view's 2^20 JSON values
  and 64 MiB, the synthesized ``.zmetadata``'s 2^20 values), with ``max_ratio`` and
  ``max_record`` (which need sets of more than ``max_source`` allows, or a Parquet set, whose
  charge against ``max_open_memory`` includes its record cache) and what only ``refmount
  serve`` has (a listing of 100,000 keys, ``max_clients``).

Where the exact edge is arithmetic of refmount's own (keys and URLs of a ``gen`` entry, what a
record file decodes to, an index file's size), it is measured here with refmount's own code on
the very files, and checked.
"""

from __future__ import annotations

import gzip
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from refmount.core.consolidated import MAX_VALUES as ZMETADATA_VALUES
from refmount.decode.metadatabound import MAX_BYTES as DECODED_BYTES
from refmount.decode.metadatabound import MAX_VALUES as DECODED_VALUES
from support.bombs import json_values, list_of_values, metadata_of_bytes, metadata_with_values

MiB = 1 << 20
TARGET = bytes(range(256)) * 16
CHUNK_BYTES = TARGET[16:80]
BIG = 32 * MiB
MEMORY_CACHE = 8 * MiB  # each open set's memory cache (and the least a catalogue's set gets)


@dataclass
class Probe:
    """One side of one bound: ``key`` of set ``name`` reads as ``expected`` (None: any bytes),
    or is refused: ``refused`` "open" (the set cannot be opened: EIO, 503 with the fixed text)
    or "read" (the key alone: EIO, ``status`` over HTTP); ``log`` the words of its one log line."""

    bound: str
    name: str
    key: str
    expected: bytes | None = CHUNK_BYTES
    refused: str = ""
    status: int = 503
    log: tuple[str, ...] = ()
    serve_only: bool = False


@dataclass
class Catalogue:
    path: Path  # the list file
    options: list[str]
    probes: list[Probe]
    entries: dict[str, object] = field(default_factory=dict)
    notes: dict[str, int] = field(default_factory=dict)


def write(path: Path, content: bytes | str | dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, dict):
        content = json.dumps(content)
    path.write_bytes(content if isinstance(content, bytes) else content.encode())
    return path


def v1(refs: dict[str, object], **more: object) -> bytes:
    return json.dumps({"version": 1, **more, "refs": refs}).encode()


def v0(refs: dict[str, object]) -> bytes:
    """A Version 0 set: read in one pass (a Version 1 set's sections are read in turn)."""
    return json.dumps(refs).encode()


def _pair(cat: Catalogue, bound: str, make: object, under: object, over: object, words: tuple[str, ...],
          key: str = "c", ext: str = ".json") -> None:
    """Sets ``BOUND-under`` and ``BOUND-over`` (``make(side_value) -> bytes``), refused at open."""
    assert callable(make)
    for side, value in (("under", under), ("over", over)):
        name = f"{bound}-{side}"
        cat.entries[name] = str(write(cat.path.parent / f"{name}{ext}", make(value)))
        cat.probes.append(Probe(bound, name, key, refused="" if side == "under" else "open",
                                log=() if side == "under" else (f"set {name}: cannot be opened", *words)))


def index_bytes(source: Path) -> int:
    """The size of the index refmount makes of ``source`` (what an open set is charged)."""
    from refmount.refs import prepare_index
    from refmount.refs.limits import Limits

    made = prepare_index(str(source), {}, bad_keys="error", limits=Limits(), cache_dir=None)
    try:
        return os.path.getsize(made.path)
    finally:
        os.unlink(made.path)


def lowered(d: Path) -> Catalogue:
    """The catalogue of the bounds an option lowers (see the module's docstring)."""
    target = write(d / "target.bin", TARGET)
    chunk = [str(target), 16, 64]
    cat = Catalogue(d / "sets.json", [], [])
    _pair(cat, "max_inline", lambda n: v1({"big": "x" * n, "c": chunk}), MiB, MiB + 1,
          ("max_inline=1M", "big"))
    _pair(cat, "max_keys", lambda n: v1({"c": chunk, **{f"k/{i}": "v" for i in range(n)}}), 999, 1000,
          ("max_keys=1000",))
    _pair(cat, "max_key_length",
          lambda n: v1({"c": chunk, "/".join(["k" * 200] * 5) + "/" + "k" * (n - 1005): "v"}),
          1024, 1025, ("max_key_length=1K",))
    _pair(cat, "max_key_depth", lambda n: v1({"c": chunk, "/".join(["d"] * n): "v"}), 16, 17,
          ("max_key_depth=16",))

    def nested(n: int) -> bytes:  # the document, refs, .zattrs, then n objects
        value: object = 1
        for _ in range(n):
            value = {"a": value}
        return v1({"c": chunk, ".zattrs": value})

    _pair(cat, "max_nesting", nested, 6, 7, ("max_nesting=8",))

    def padded(n: int) -> bytes:
        doc = v1({"c": chunk})
        return doc + b" " * (n - len(doc))

    _pair(cat, "max_source", padded, 2 * MiB, 2 * MiB + 1, ("max_source=2M",))
    # max_generated: a gen entry of 900 keys of 14 bytes and one URL; over it, a refs key of 1 byte more
    gen = [{"key": "gen/key/{{i}}", "url": str(target), "offset": "16", "length": "64",
            "dimensions": {"i": {"start": 100000, "stop": 100900}}}]
    generated = 900 * len("gen/key/100000") + len(str(target))
    _pair(cat, "max_generated", lambda extra: v1(extra, gen=gen), {}, {"x": "v"},
          ("max_generated=", f"more than {generated:,} bytes"), key="gen/key/100000")
    # max_template_seconds=0.5: one rendering of a million loop steps (some 0.1 CPU s), then
    # twenty distinct ones (some 2 s, stopped at 0.5)
    loop = "{% for j in range(1000) %}{% for k in range(N) %}{% endfor %}{% endfor %}"
    _pair(cat, "max_template_seconds",
          lambda n: v1({f"c{i}": [loop.replace("N", str(1000 - i)) + str(target), 16, 64] for i in range(n)}
                       | {"c": chunk}), 1, 20, ("max_template_seconds=0.5",))
    # max_open_memory: "m-a" held while "m-b" opens (just fits) and "m-c" (a larger index) does not
    big = d / "big.bin"  # 32 MiB (sparse): more than a stuck client's socket buffers take
    with open(big, "wb") as f:
        f.truncate(BIG)
    charges = {}
    for name, pad in (("m-a", 0), ("m-b", 0), ("m-c", 8)):
        path = write(d / f"{name}.json", v1({"k": [str(big), 0, BIG], "pad": "p" * (pad + 1),
                                                "c": chunk}))
        cat.entries[name] = str(path)
        charges[name] = index_bytes(path) + MEMORY_CACHE
    assert charges["m-a"] == charges["m-b"] < charges["m-c"], charges
    memory = charges["m-a"] + charges["m-b"]
    cat.notes["max_open_memory"] = memory
    cat.notes["max_open_memory_over_by"] = charges["m-c"] - charges["m-b"]
    cat.probes += [Probe("max_open_memory", "m-b", "c"),
                   Probe("max_open_memory", "m-c", "c", refused="open", log=("set m-c: not opened",
                                                                              "max_open_memory"))]
    cat.options = ["max_inline=1M", "max_keys=1000", "max_key_length=1K", "max_key_depth=16",
                   "max_nesting=8", "max_source=2M", f"max_generated={generated}",
                   "max_template_seconds=0.5", f"max_open_memory={memory}", f"memory_cache={MEMORY_CACHE}",
                   f"max_sets={len(cat.entries)}"]
    write(cat.path, {"sets": cat.entries})
    return cat


def _record(path: Path, rows: int, raw_bytes: int, longer_by: int = 0) -> list[bytes]:
    """A record file of ``rows`` inline values of random bytes (the last ``longer_by`` longer)."""
    raws = [os.urandom(raw_bytes) for _ in range(rows)]
    raws[-1] += os.urandom(longer_by)
    pq.write_table(pa.table({"path": pa.array([None] * rows, pa.string()),
                             "offset": pa.array([0] * rows, pa.int64()),
                             "size": pa.array([len(r) for r in raws], pa.int64()),
                             "raw": pa.array(raws, pa.binary())}), path, compression="none")
    return raws


def record_need(path: Path) -> int:
    """The least ``max_record`` that reads the record file ``path`` (refmount's own check)."""
    from refmount.refs.recordfile import RecordRefused, read_record

    def reads(bound: int) -> bool:
        with open(path, "rb") as f:
            try:
                read_record(f, str(path), 100, bound)
                return True
            except RecordRefused:
                return False

    lo, hi = 1, 64 * MiB
    assert reads(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reads(mid) else (mid + 1, hi)
    return lo


def at_code_values(d: Path, ratio_spaces: int = 66 * MiB) -> Catalogue:
    """The catalogue of the bounds met at the code's value, max_ratio, max_record and the
    serve-only ones (see the module's docstring)."""
    target = write(d / "target.bin", TARGET)
    chunk = [str(target), 16, 64]
    cat = Catalogue(d / "sets.json", [], [])
    # decoded metadata (-o decode, per set): 2^20 JSON values, then one more; 64 MiB read, then one more
    for side, total in (("under", DECODED_VALUES), ("over", DECODED_VALUES + 1)):
        refs = {k: v.decode() for k, v in metadata_with_values(total).items()}
        name = f"decoded-values-{side}"
        cat.entries[name] = {"source": str(write(d / f"{name}.json", v0({**refs, "c": chunk}))),
                             "options": "decode"}
        why = ("no decoded metadata", f"{DECODED_VALUES:,} JSON values")
        cat.probes.append(Probe("decoded metadata values", name, "a0/.zattrs", None,
                                refused="read" if side == "over" else "", log=why if side == "over" else ()))
    for side, total in (("under", DECODED_BYTES), ("over", DECODED_BYTES + 1)):
        refs = {k: v.decode() for k, v in metadata_of_bytes(total).items()}
        name = f"decoded-bytes-{side}"
        doc = gzip.compress(v0({**refs, "c": chunk}), 1)
        cat.entries[name] = {"source": str(write(d / f"{name}.json.gz", doc)), "options": "decode"}
        why = ("no decoded metadata", f"{DECODED_BYTES:,} bytes")
        cat.probes.append(Probe("decoded metadata bytes", name, "a000/.zattrs", None,
                                refused="read" if side == "over" else "", log=why if side == "over" else ()))
    # the synthesized .zmetadata (refmount serve): 2^20 JSON values, then one more
    group = b'{"zarr_format":2}'
    for side, total in (("under", ZMETADATA_VALUES), ("over", ZMETADATA_VALUES + 1)):
        attrs = list_of_values(total - json_values(group))
        name = f"zmetadata-{side}"
        cat.entries[name] = str(write(d / f"{name}.json", v0({".zgroup": group.decode(),
                                                               ".zattrs": attrs.decode(), "c": chunk})))
        cat.probes.append(Probe("synthesized .zmetadata values", name, ".zmetadata", None,
                                refused="read" if side == "over" else "", serve_only=True,
                                log=("no consolidated metadata (.zmetadata) is served",) * (side == "over")))
    # max_ratio: gzip sets of the same whitespace after a head of incompressible bytes, the
    # under one's head longer; max_ratio between their ratios (each read whole before it passes)
    ratios = {}
    for side, head in (("under", 8_200), ("over", 8_000)):
        noise = os.urandom(head).hex()
        doc = v0({"c": chunk, "noise": noise}) + b" " * ratio_spaces
        packed = gzip.compress(doc, 9)
        ratios[side] = len(doc) / len(packed)
        cat.entries[f"max_ratio-{side}"] = str(write(d / f"max_ratio-{side}.json.gz", packed))
    ratio = int(ratios["over"])
    assert ratios["under"] <= ratio < ratios["over"], ratios
    cat.notes["max_ratio"] = ratio
    cat.probes += [Probe("max_ratio", "max_ratio-under", "c"),
                   Probe("max_ratio", "max_ratio-over", "c", refused="open",
                         log=("set max_ratio-over: cannot be opened", f"max_ratio={ratio}"))]
    # max_record: a Parquet set of two record files, the second's last row longer by 8 bytes
    rec = d / "records.parq"
    write(rec / ".zmetadata", {"metadata": {".zgroup": {"zarr_format": 2}, "v/.zarray": {
        "zarr_format": 2, "shape": [200], "chunks": [1], "dtype": "|u1", "compressor": None,
        "filters": None, "fill_value": 0, "order": "C"}}, "record_size": 100})
    (rec / "v").mkdir()
    first = _record(rec / "v" / "refs.0.parq", 100, 11_000)
    _record(rec / "v" / "refs.1.parq", 100, 11_000, longer_by=8)
    need, over = (record_need(rec / "v" / f"refs.{i}.parq") for i in (0, 1))
    assert MiB <= need < over, (need, over)
    cat.notes["max_record"], cat.notes["max_record_over_by"] = need, over - need
    cat.entries["records"] = str(rec)
    cat.probes += [Probe("max_record", "records", "v/0", first[0]),
                   Probe("max_record", "records", "v/199", refused="read", status=502,
                         log=("refs.1.parq", "max_record="))]
    # a listing of 100,000 keys (refmount serve: per-client listing pieces)
    listing = {f"d/k{i:06d}": "x" for i in range(100_000)} | {".zgroup": '{"zarr_format":2}', "c": chunk}
    cat.entries["listing"] = str(write(d / "listing.json", v0(listing)))
    cat.probes.append(Probe("listings", "listing", "c", serve_only=True))
    cat.options = [f"max_ratio={ratio}", f"max_record={need}"]
    write(cat.path, {"sets": cat.entries})
    return cat
