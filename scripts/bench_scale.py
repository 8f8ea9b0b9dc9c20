#!/usr/bin/env python3
"""Scale benchmark (issue 3): reference sets of millions of keys, refmount vs. fsspec.

For every size in ``--keys`` (default 1,000,000 and 10,000,000) and every format, one table:

* **V0 JSON** -- a zarr-like Version 0 set of N keys: ``.zgroup``/``.zattrs``, ~10 arrays
  ``varKK`` with ``.zarray``/``.zattrs`` and chunk keys ``varKK/i.j`` = ``[url, offset, length]``
  into a few hundred sparse local target files;
* **Parquet** -- the *same* keys in fsspec's LazyReferenceMapper layout (``.zmetadata`` +
  ``varKK/refs.<n>.parq``, columns path/offset/size/raw, ``record_size`` 10,000), written with
  pyarrow directly (vectorised; ``LazyReferenceMapper`` itself needs hours for 10M keys). Every
  run first checks the writer on a small set against ``LazyReferenceMapper.create`` + ``flush``
  (same files, same rows) and reads it back with fsspec's ``ReferenceFileSystem``;
* **V1 gen** -- a Version 1 file with one ``gen`` entry whose two dimensions give N products
  (``var/{{i}}.{{j}}`` -> ``http://127.0.0.1/file_{{i // 100}}.nc``, offset
  ``{{ (i * J + j) * 4096 }}``, length 4096) plus four metadata keys.

Inputs are generated once under ``--workdir`` (default ``bench-work/scale``) and reused.

Peers (rows):

* refmount (``.venv/bin/refmount SOURCE MNT -o ...``, detached daemon): ``-o no_disk_cache``;
  for JSON also a fresh ``cache_dir`` mounted twice (first mount parses and persists the index,
  the second mount of the unchanged file reuses it). Parquet: ``no_disk_cache`` only (nothing
  is parsed at mount time);
* fsspec ``ReferenceFileSystem`` in-process (no FUSE; V1 with ``simple_templates=False``,
  because with fsspec's defaults ``gen`` is silently dropped): construct time, RSS after
  construct, peak RSS, ``fs.info`` rate over the random keys, ``fs.find("")``. For V1 the
  expansion rate is first measured on a 5,000-product ``gen``; when the extrapolated time
  exceeds the bound the full expansion is not started (reported as DNF with the estimate);
* fsspec's FUSE bridge (``fsspec.fuse.run``, fusepy + libfuse2: ``scripts/setup.sh --bench``)
  over the same ReferenceFileSystem, its readiness bounded by ``--fuse-timeout``.

Every step is bounded: the refmount CLI by ``--mount-timeout``, ``find`` by ``--find-timeout``,
random stats by ``--stats-budget``, fsspec in-process by ``--inproc-timeout``, fsspec.fuse
readiness by ``--fuse-timeout``; a peer that does not finish shows ``DNF >Ns``. Only processes
started here are ever signalled (the refmount daemon is found by its command line, which names
the mount point), and every mount is unmounted in ``finally``.

Columns: time until the mount answers (refmount: exec of the CLI until it returns 0; fsspec.fuse:
until ``stat(MNT/.zgroup)`` works; in-process: the constructor), the serving process's RSS after
settling and its peak (VmHWM after all workloads), the refmount CLI's own peak RSS (it parses
before it spawns the daemon), ``find MNT | wc -l`` time and line count (checked), the server's
CPU seconds during that ``find``, the rate of ``os.stat`` over random keys (run before ``find``,
cold kernel caches, ``st_size`` checked), the 1-minute load average at the start and end of the
row (the machine may be shared), and the issue's goals next to the numbers.

Usage:
    .venv/bin/python scripts/bench_scale.py                  # 1M and 10M keys, all formats
    .venv/bin/python scripts/bench_scale.py --quick          # 10,000 keys smoke run
    .venv/bin/python scripts/bench_scale.py --keys 1000000 --formats parquet --only refmount
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import math
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
MiB = 1024 * 1024
GiB = 1024 * MiB
FORMATS = ("json", "parquet", "gen")
FORMAT_TITLES = {"json": "V0 JSON", "parquet": "Parquet", "gen": "V1 gen"}
GEN_CALIBRATION = 5_000  # products of the small gen that measures fsspec's expansion rate


def human(n: int) -> str:
    for unit, div in (("M", 1_000_000), ("k", 1_000)):
        if n >= div and n % div == 0:
            return f"{n // div}{unit}"
    return f"{n:,}"


# --------------------------------------------------------------------------------------------
# Reference sets
# --------------------------------------------------------------------------------------------


@dataclass
class Layout:
    """Deterministic layout of the V0/Parquet reference set (keys computable by index)."""

    keys: int
    arrays: int
    targets: int
    target_dir: Path
    chunk_side: int = 100
    counts: list[int] = field(default_factory=list)  # chunks per array
    cols: list[int] = field(default_factory=list)  # chunk-grid columns per array

    def __post_init__(self) -> None:
        n_meta = 2 + 2 * self.arrays
        n_chunks = self.keys - n_meta
        if n_chunks < self.arrays:
            raise SystemExit(f"--keys must be at least {n_meta + self.arrays}")
        base, rem = divmod(n_chunks, self.arrays)
        self.counts = [base + (1 if k < rem else 0) for k in range(self.arrays)]
        self.cols = [math.ceil(math.sqrt(c)) for c in self.counts]

    def var(self, k: int) -> str:
        return f"var{k:02d}"

    def target(self, t: int) -> str:
        return str(self.target_dir / f"part-{t:04d}.nc")

    def rows(self, k: int) -> int:
        return math.ceil(self.counts[k] / self.cols[k])

    def zarray(self, k: int) -> str:
        s = self.chunk_side
        meta = {
            "chunks": [s, s],
            "compressor": {"id": "zlib", "level": 4},
            "dtype": "<f4",
            "fill_value": "NaN",
            "filters": None,
            "order": "C",
            "shape": [self.rows(k) * s, self.cols[k] * s],
            "zarr_format": 2,
        }
        return json.dumps(meta, indent=4)

    def meta_entries(self) -> list[tuple[str, str]]:
        out = [
            (".zattrs", json.dumps({"title": "refmount scale benchmark", "keys": self.keys}, indent=4)),
            (".zgroup", json.dumps({"zarr_format": 2}, indent=4)),
        ]
        for k in range(self.arrays):
            v = self.var(k)
            attrs = json.dumps({"_ARRAY_DIMENSIONS": [f"y{k}", f"x{k}"], "units": "K"}, indent=4)
            out += [(f"{v}/.zarray", self.zarray(k)), (f"{v}/.zattrs", attrs)]
        return out

    def chunk_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(target index, offset, length) of every chunk in generation order (array by array,
        C order), and each target's size. Chunk g goes to target g % targets, after the chunks
        before it in that target; its length is 20,000..59,999 bytes, pseudo-random."""
        total = sum(self.counts)
        g = np.arange(total, dtype=np.int64)
        lengths = 20_000 + (g * 2_654_435_761) % 40_000
        tgt = g % self.targets
        m = np.zeros(math.ceil(total / self.targets) * self.targets, np.int64)
        m[:total] = lengths
        m = m.reshape(-1, self.targets)
        offsets = (np.cumsum(m, axis=0) - m).reshape(-1)[:total]
        return tgt, offsets, lengths, m.sum(axis=0)

    def make_targets(self, sizes: np.ndarray) -> None:
        """Sparse target files of the right size: reads resolve (to zeros), no disk used."""
        self.target_dir.mkdir(parents=True, exist_ok=True)
        for t, size in enumerate(sizes.tolist()):
            with open(self.target(t), "ab") as tf:
                tf.truncate(size)

    def sample(self, n: int, meta_size, seed: int = 12345) -> list[tuple[str, int]]:
        """n random (key, expected st_size) pairs: 1% metadata keys, the rest chunk keys."""
        rng = random.Random(seed)
        meta = [(k, meta_size(text)) for k, text in self.meta_entries()]
        starts = [sum(self.counts[:k]) for k in range(self.arrays)]
        total = sum(self.counts)
        out = []
        for _ in range(n):
            if rng.random() < 0.01:
                out.append(rng.choice(meta))
                continue
            g = rng.randrange(total)
            k = max(i for i in range(self.arrays) if starts[i] <= g)
            i, j = divmod(g - starts[k], self.cols[k])
            out.append((f"{self.var(k)}/{i}.{j}", 20_000 + (g * 2_654_435_761) % 40_000))
        return out


def generate_v0(layout: Layout, path: Path) -> None:
    tgt, offsets, lengths, sizes = layout.chunk_columns()
    tmp = path.with_name(path.name + ".tmp")
    urls = [json.dumps(layout.target(t)) for t in range(layout.targets)]
    with open(tmp, "w", buffering=8 * MiB) as f:
        f.write("{\n")
        for key, text in layout.meta_entries():
            f.write(f"{json.dumps(key)}: {json.dumps(text)},\n")
        g0, first = 0, True
        for k in range(layout.arrays):
            v, cols, c = layout.var(k), layout.cols[k], layout.counts[k]
            for lo in range(0, c, 100_000):
                hi = min(lo + 100_000, c)
                tl = tgt[g0 + lo : g0 + hi].tolist()
                ol = offsets[g0 + lo : g0 + hi].tolist()
                ll = lengths[g0 + lo : g0 + hi].tolist()
                lines = [
                    f'"{v}/{idx // cols}.{idx % cols}": [{urls[tl[n]]}, {ol[n]}, {ll[n]}]'
                    for n, idx in enumerate(range(lo, hi))
                ]
                f.write(("" if first else ",\n") + ",\n".join(lines))
                first = False
            g0 += c
        f.write("\n}\n")
    os.replace(tmp, path)
    layout.make_targets(sizes)


def generate_parquet(layout: Layout, root: Path, record_size: int) -> int:
    """Write the V0 set's keys in LazyReferenceMapper's layout; returns the record-file count.

    As ``LazyReferenceMapper.write`` does: every record file has ``record_size`` rows (grid
    cells without a key and rows past the grid: path/raw null, offset/size 0), path as strings,
    offset/size int64, raw binary, zstd; a record file holding no key at all is not written.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    tgt, offsets, lengths, sizes = layout.chunk_columns()
    tmp = root.with_name(root.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    meta = {key: json.loads(text) for key, text in layout.meta_entries()}
    (tmp / ".zmetadata").write_text(json.dumps({"metadata": meta, "record_size": record_size}))
    urls = pa.array([layout.target(t) for t in range(layout.targets)], pa.string())
    raw = pa.nulls(record_size, pa.binary())
    # as fastparquet writes them for LazyReferenceMapper: offset/size required, path/raw optional
    schema = pa.schema(
        [
            pa.field("path", pa.string()),
            pa.field("offset", pa.int64(), nullable=False),
            pa.field("size", pa.int64(), nullable=False),
            pa.field("raw", pa.binary()),
        ]
    )
    files, g0 = 0, 0
    for k in range(layout.arrays):
        c = layout.counts[k]
        cells = layout.rows(k) * layout.cols[k]
        d = tmp / layout.var(k)
        d.mkdir()
        for r in range(math.ceil(cells / record_size)):
            lo, hi = r * record_size, min((r + 1) * record_size, c)
            n = hi - lo
            if n <= 0:
                continue
            idx = np.full(record_size, -1, np.int64)
            off = np.zeros(record_size, np.int64)
            size = np.zeros(record_size, np.int64)
            idx[:n] = tgt[g0 + lo : g0 + hi]
            off[:n] = offsets[g0 + lo : g0 + hi]
            size[:n] = lengths[g0 + lo : g0 + hi]
            path = urls.take(pa.array(idx, mask=idx < 0))
            table = pa.table([path, pa.array(off), pa.array(size), raw], schema=schema)
            # statistics (null counts) matter: without them fastparquet, fsspec's default engine,
            # reads offset/size as nullable and hands fsspec floats
            pq.write_table(table, d / f"refs.{r}.parq", compression="zstd", write_statistics=True)
            files += 1
        g0 += c
    shutil.rmtree(root, ignore_errors=True)
    os.replace(tmp, root)
    layout.make_targets(sizes)
    return files


def verify_parquet_layout(work: Path) -> str:
    """Write a small set with our writer and with LazyReferenceMapper.create + flush; the two
    must hold the same record files with the same rows, and fsspec must read ours. Returns a
    one-line summary; raises SystemExit on any difference."""
    import fastparquet
    import fsspec
    import pyarrow as pa
    import pyarrow.parquet as pq
    from fsspec.implementations.reference import LazyReferenceMapper, ReferenceFileSystem

    base = work / "verify-parquet"
    shutil.rmtree(base, ignore_errors=True)
    # 2 x 1,250 chunks on a 35 x 36 grid: the last record (grid cells 1,250..1,259) holds no
    # key, so it is not written -- as in the 1M set, whose arrays end the same way
    record_size = 10
    layout = Layout(2_506, 2, 7, base / "targets")
    ours, theirs = base / "ours", base / "lrm"
    generate_parquet(layout, ours, record_size)
    tgt, offsets, lengths, _ = layout.chunk_columns()
    m = LazyReferenceMapper.create(str(theirs), fs=fsspec.filesystem("file"), record_size=record_size)
    expect: dict[str, list] = {}
    for key, text in layout.meta_entries():
        m[key] = text
    g = 0
    for k in range(layout.arrays):
        for idx in range(layout.counts[k]):
            key = f"{layout.var(k)}/{idx // layout.cols[k]}.{idx % layout.cols[k]}"
            ref = [layout.target(int(tgt[g])), int(offsets[g]), int(lengths[g])]
            m[key] = ref
            expect[key] = ref
            g += 1
    m.flush()

    def fail(msg: str) -> None:
        raise SystemExit(f"Parquet layout check failed: {msg} (see {base})")

    def listing(root: Path) -> list[str]:
        return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())

    if listing(ours) != listing(theirs):
        fail(f"files differ: {listing(ours)} vs {listing(theirs)}")
    last = f"{layout.var(0)}/refs.{math.ceil(layout.rows(0) * layout.cols[0] / record_size) - 1}.parq"
    if last in listing(ours):
        fail(f"{last} should not exist (no key in it)")
    if json.loads((ours / ".zmetadata").read_text()) != json.loads((theirs / ".zmetadata").read_text()):
        fail(".zmetadata differs")
    nfiles = 0
    for rel in listing(ours):
        if not rel.endswith(".parq"):
            continue
        nfiles += 1
        cols = []
        schemas = [str(pq.ParquetFile(root / rel).schema).split("\n", 1)[1] for root in (ours, theirs)]
        if schemas[0] != schemas[1]:
            fail(f"{rel}: Parquet schema differs: {schemas[0]} vs {schemas[1]}")
        # (LazyReferenceMapper stores a pandas categorical path when urls repeat; both read as str)
        dtypes = [
            {c: "O" if str(t) in ("object", "category") else str(t) for c, t in pf.dtypes.items()}
            for pf in (fastparquet.ParquetFile(str(root / rel)) for root in (ours, theirs))
        ]
        if dtypes[0] != dtypes[1]:
            fail(f"{rel}: fastparquet reads the columns as {dtypes[0]}, not {dtypes[1]}")
        for root in (ours, theirs):
            t = pq.read_table(root / rel)
            out = {}
            for c in ("path", "offset", "size", "raw"):
                a = t[c].combine_chunks()
                if pa.types.is_dictionary(a.type):
                    a = a.dictionary_decode()
                out[c] = a.to_pylist()
            cols.append((t.column_names, out))
        if cols[0] != cols[1]:
            fail(f"{rel}: rows differ from LazyReferenceMapper's")
    fs = ReferenceFileSystem(fo=str(ours))
    for key in random.Random(1).sample(sorted(expect), 200):
        got = list(fs.references[key])
        ints = all(isinstance(x, int | np.integer) for x in got[1:])
        if not ints or got != expect[key] or fs.info(key)["size"] != expect[key][2]:
            fail(f"fsspec reads {key} as {got}, expected {expect[key]}")
        if len(fs.cat_file(key)) != expect[key][2]:
            fail(f"fsspec cat_file({key}) has the wrong length")
    pad = f"{layout.var(0)}/{layout.rows(0) - 1}.{layout.cols[0] - 1}"  # grid cell without key
    if pad in expect or pad in fs.references:
        fail(f"{pad} should not exist")
    shutil.rmtree(base, ignore_errors=True)
    return (
        f"Parquet writer checked: identical to LazyReferenceMapper.create + flush for a "
        f"{layout.keys:,}-key set ({nfiles} record files, record_size {record_size}; same Parquet "
        "schema and rows, key-less last record not written); "
        "fsspec ReferenceFileSystem reads it (200 keys, info, cat_file; grid padding absent)"
    )


def gen_dims(n: int) -> tuple[int, int]:
    """I x J = n, as square as possible."""
    j = math.isqrt(n)
    while n % j:
        j -= 1
    return n // j, j


def gen_meta(n: int) -> dict[str, str]:
    ni, nj = gen_dims(n)
    zarray = {
        "chunks": [1, 1024],
        "compressor": None,
        "dtype": "<f4",
        "fill_value": 0,
        "filters": None,
        "order": "C",
        "shape": [ni, nj * 1024],
        "zarr_format": 2,
    }
    return {
        ".zgroup": json.dumps({"zarr_format": 2}),
        ".zattrs": json.dumps({"title": "refmount scale benchmark (gen)", "products": n}),
        "var/.zarray": json.dumps(zarray),
        "var/.zattrs": json.dumps({"_ARRAY_DIMENSIONS": ["y", "x"]}),
    }


def gen_doc(n: int) -> dict:
    ni, nj = gen_dims(n)
    entry = {
        "key": "var/{{i}}.{{j}}",
        "url": "http://127.0.0.1/file_{{i // 100}}.nc",
        "offset": f"{{{{ (i * {nj} + j) * 4096 }}}}",
        "length": "4096",
        "dimensions": {"i": {"start": 0, "stop": ni, "step": 1}, "j": {"stop": nj}},
    }
    return {"version": 1, "templates": {}, "gen": [entry], "refs": gen_meta(n)}


def gen_sample(n: int, count: int, seed: int = 12345) -> list[tuple[str, int]]:
    rng = random.Random(seed)
    ni, nj = gen_dims(n)
    meta = [(k, len(v.encode())) for k, v in gen_meta(n).items()]
    out = []
    for _ in range(count):
        if rng.random() < 0.01:
            out.append(rng.choice(meta))
        else:
            out.append((f"var/{rng.randrange(ni)}.{rng.randrange(nj)}", 4096))
    return out


@dataclass
class Dataset:
    fmt: str
    n: int  # keys (V0, Parquet) or gen products (V1)
    source: Path
    keys: int  # keys in the set
    expected_find: int  # lines of `find MNT`: keys + directories + root
    sample: list[tuple[str, int]]
    desc: str
    other_counts: dict[int, str] = field(default_factory=dict)  # known other find counts

    @property
    def title(self) -> str:
        return f"{FORMAT_TITLES[self.fmt]} {human(self.n)}"


def du(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def prepare(fmt: str, n: int, args, work: Path, log) -> Dataset:
    """Generate (once) and describe the reference set of a format and size."""
    if fmt == "gen":
        src = work / f"gen-{n}.json"
        if args.regen or not src.exists():
            log(f"generating {src} ({n:,} products) ...")
            tmp = src.with_name(src.name + ".tmp")
            tmp.write_text(json.dumps(gen_doc(n), indent=1))
            os.replace(tmp, src)
        ni, nj = gen_dims(n)
        return Dataset(
            fmt, n, src, n + 4, n + 4 + 2, gen_sample(n, args.stats),
            f"{src.name}: one gen entry, {ni:,} x {nj:,} products + 4 refs, {du(src):,} bytes",
        )
    tag = f"{n}-a{args.arrays}-t{args.targets}"
    layout = Layout(n, args.arrays, args.targets, work / f"targets-{tag}")
    if fmt == "json":
        src = work / f"v0-{tag}.json"
        if args.regen or not src.exists():
            log(f"generating {src} ({n:,} keys) ...")
            t0 = time.perf_counter()
            generate_v0(layout, src)
            log(f"  done in {time.perf_counter() - t0:.1f} s")
        sample = layout.sample(args.stats, lambda text: len(text.encode()))
        desc = f"{src.name}: {du(src) / MiB:,.0f} MiB"
    else:
        src = work / f"parquet-{tag}-r{args.record_size}"
        if args.regen or not (src / ".zmetadata").exists():
            log(f"generating {src} ({n:,} keys, record_size {args.record_size}) ...")
            t0 = time.perf_counter()
            generate_parquet(layout, src, args.record_size)
            log(f"  done in {time.perf_counter() - t0:.1f} s")
        # served like LazyReferenceMapper serves them: json.dumps of the parsed value
        sample = layout.sample(args.stats, lambda text: len(json.dumps(json.loads(text)).encode()))
        nfiles = sum(1 for _ in src.glob("*/refs.*.parq"))
        desc = f"{src.name}/: {nfiles:,} record files, {du(src) / MiB:,.0f} MiB"
    desc += f"; {args.arrays} arrays, {args.targets} targets"
    ds = Dataset(fmt, n, src, n, n + args.arrays + 1, sample, desc)
    cells = sum(layout.rows(k) * layout.cols[k] for k in range(args.arrays))
    if fmt == "parquet" and cells != sum(layout.counts):
        ds.other_counts[ds.expected_find + cells - sum(layout.counts) + 1] = (
            "lists .zmetadata and every chunk-grid cell, also those without a key"
        )
    return ds


# --------------------------------------------------------------------------------------------
# Process / mount helpers
# --------------------------------------------------------------------------------------------


def proc_status(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of a process, in bytes ({} if it is gone)."""
    out = {}
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    out[name] = int(rest.split()[0]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return out


def proc_cpu(pid: int) -> float | None:
    """User + system CPU seconds of a process so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
    except (FileNotFoundError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def run_rusage(cmd: list[str], timeout: float) -> tuple[int | None, str, float, int]:
    """Run cmd; (exit code or None on timeout, stderr, seconds, the process's own peak RSS).

    The peak comes from wait4(2), so it covers the foreground CLI (loading and validating the
    references) and not the detached daemon, which it does not wait for.
    """
    with tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=err, stderr=err)
        deadline = time.monotonic() + timeout
        while True:
            pid, status, ru = os.wait4(p.pid, os.WNOHANG)
            if pid:
                elapsed = time.perf_counter() - t0
                p.returncode = os.waitstatus_to_exitcode(status)
                break
            if time.monotonic() > deadline:
                p.kill()
                p.wait()
                return None, "", timeout, 0
            time.sleep(0.002)
        err.seek(0)
        return p.returncode, err.read(), elapsed, ru.ru_maxrss * 1024


def pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (FileNotFoundError, IndexError):
        return False


def pids_for_mount(mnt: Path) -> list[int]:
    """PIDs (not ours) whose command line has the mount point as an argument."""
    want = {str(mnt), str(mnt) + "/"}
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                args = f.read().split(b"\0")
        except OSError:
            continue
        if any(a.decode(errors="replace") in want for a in args):
            found.append(int(d))
    return sorted(found)


def is_mounted(mnt: Path) -> bool:
    target = str(mnt)
    with open("/proc/self/mounts") as f:
        for line in f:
            parts = line.split()
            if len(parts) > 1 and parts[1].replace("\\040", " ") == target:
                return True
    return False


def unmount(mnt: Path, pids: list[int], log) -> None:
    """Unmount mnt and make sure the given (own) server processes are gone."""
    for attempt in range(10):
        if not is_mounted(mnt):
            break
        r = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
        if r.returncode == 0:
            break
        if attempt == 9:
            log(f"  fusermount3 -u failed ({r.stderr.strip()}); lazy unmount")
            subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)
        time.sleep(0.5)
    for pid in pids:
        deadline = time.monotonic() + 15
        while pid_alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if not pid_alive(pid):
                break
            log(f"  server pid {pid} still alive after unmount: {sig.name}")
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
            deadline = time.monotonic() + 5
            while pid_alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
    if is_mounted(mnt):
        subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def wait_answers(mnt: Path, probe: str, timeout: float, proc=None, on_tick=None) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        if on_tick is not None:
            on_tick()
        if is_mounted(mnt):
            try:
                os.stat(mnt / probe)
                return True
            except OSError:
                pass
        time.sleep(0.005 if on_tick is None else 0.05)
    return False


def run_find(mnt: Path, timeout: float) -> tuple[float | None, int | None]:
    """Time `find MNT | wc -l`; (None, None) when it does not finish within timeout."""
    t0 = time.perf_counter()
    p = subprocess.Popen(
        ["bash", "-c", 'find "$1" | wc -l', "find", str(mnt)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.communicate()
        return None, None
    return time.perf_counter() - t0, int(out.strip() or 0)


def is_meta(key: str) -> bool:
    return key.rsplit("/", 1)[-1].startswith(".z")


def size_problems(errors: int, wrong: dict[bool, int], done: int) -> str:
    """A note on failed stats and wrong st_size, metadata and chunk keys apart ("" if none)."""
    if not (errors or wrong[True] or wrong[False]):
        return ""
    return (
        f"{errors} errors, wrong st_size on {wrong[False]} chunk keys and {wrong[True]} metadata"
        f" keys, of {done:,}"
    )


def run_stats(mnt: Path, sample: list[tuple[str, int]], budget: float) -> tuple[float, int, str]:
    """os.stat over the sample for at most `budget` seconds (checked after every call, in a
    worker thread: a stat that hangs is abandoned after budget + 30 s and returns when the
    mount goes away); (rate per s, done, problems note)."""
    st8 = {"done": 0, "errors": 0, "end": None}
    wrong = {True: 0, False: 0}
    stop = threading.Event()
    t0 = time.perf_counter()

    def work() -> None:
        for key, size in sample:
            if stop.is_set() or time.perf_counter() - t0 > budget:
                break
            try:
                if os.stat(mnt / key).st_size != size:
                    wrong[is_meta(key)] += 1
            except OSError:
                st8["errors"] += 1
            st8["done"] += 1
        st8["end"] = time.perf_counter()

    th = threading.Thread(target=work, daemon=True)
    th.start()
    th.join(budget + 30)
    stop.set()
    end = st8["end"] or time.perf_counter()
    done = st8["done"]
    note = size_problems(st8["errors"], wrong, done)
    if th.is_alive():
        note = (note + "; " if note else "") + f"a stat() still hung after {budget + 30:.0f} s"
    return done / (end - t0), done, note


def load1() -> float:
    return os.getloadavg()[0]


@dataclass
class Row:
    ds: Dataset
    name: str
    kind: str  # "first" / "second" (refmount), "fuse", "inproc"
    mount_s: float | None = None
    mount_dnf: float | None = None
    rss_steady: int | None = None
    rss_peak: int | None = None
    find_s: float | None = None
    find_dnf: float | None = None
    find_count: int | None = None
    stat_rate: float | None = None
    cli_peak: int | None = None
    find_cpu: float | None = None
    load: tuple[float, float] | None = None
    umount_s: float | None = None
    goals: list[tuple[str, bool]] = field(default_factory=list)
    note: str = ""

    def add(self, note: str) -> None:
        self.note += f" {note.strip(' ;')};"


def measure_mount(row: Row, mnt: Path, pid: int, args, log) -> None:
    ds = row.ds
    time.sleep(args.settle)
    row.rss_steady = proc_status(pid).get("VmRSS")
    log(f"  steady RSS {fmt_mib(row.rss_steady)} MiB; {len(ds.sample):,} random stats ...")
    rate, done, problems = run_stats(mnt, ds.sample, args.stats_budget)
    row.stat_rate = rate
    if done < len(ds.sample):
        row.add(f"stats: {done:,} of {len(ds.sample):,} within {args.stats_budget:g} s")
    if problems:
        row.add(f"stat: {problems}")
    log(f"  stat {rate:,.0f}/s ({problems or 'all sizes right'}); find ...")
    cpu0 = proc_cpu(pid)
    row.find_s, row.find_count = run_find(mnt, args.find_timeout)
    cpu1 = proc_cpu(pid)
    if cpu0 is not None and cpu1 is not None:
        row.find_cpu = cpu1 - cpu0
    if row.find_s is None:
        row.find_dnf = args.find_timeout
    elif row.find_count != ds.expected_find:
        why = ds.other_counts.get(row.find_count, "")
        row.add(f"find count {row.find_count:,} != expected {ds.expected_find:,}{f' ({why})' if why else ''}")
    if not pid_alive(pid):
        row.add("server process died")
    row.rss_peak = proc_status(pid).get("VmHWM")
    log(
        f"  find {fmt_s(row.find_s, row.find_dnf)}, {row.find_count} entries; "
        f"peak RSS {fmt_mib(row.rss_peak)} MiB"
    )


# --------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------


def refmount_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "refmount"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "refmount"]


def log_tail(path: Path, n: int = 5) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def bench_refmount_foreground(ds: Dataset, name: str, mnt: Path, opts: str, logf: Path, args, log
                              ) -> Row:
    """``refmount -f``: the process started serves (as under refmount@.service); ready is the
    time until the mount answers. The parse runs in a child, so there is no CLI peak."""
    row = Row(ds, name, "first")
    mnt.mkdir(parents=True, exist_ok=True)
    cmd = [*refmount_cmd(), str(ds.source), str(mnt), "-f", "-o", f"{opts},log={logf}"]
    log(f"[{ds.title} / {name}] {shlex.join(cmd)}")
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        if not wait_answers(mnt, ".zgroup", args.mount_timeout, proc=proc):
            row.mount_dnf = args.mount_timeout if proc.poll() is None else None
            row.add(f"refmount -f did not answer (exit {proc.poll()}); log {logf}")
            return row
        row.mount_s = time.perf_counter() - t0
        log(f"  mount answered in {row.mount_s:.2f} s (serving pid {proc.pid})")
        measure_mount(row, mnt, proc.pid, args, log)
        return row
    finally:
        t0 = time.perf_counter()
        unmount(mnt, [proc.pid], log)
        row.umount_s = time.perf_counter() - t0
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)


def bench_refmount(ds: Dataset, name: str, kind: str, mnt: Path, opts: str, logf: Path, args, log) -> Row:
    row = Row(ds, name, kind)
    mnt.mkdir(parents=True, exist_ok=True)
    cmd = [*refmount_cmd(), str(ds.source), str(mnt), "-o", f"{opts},log={logf}"]
    log(f"[{ds.title} / {name}] {shlex.join(cmd)}")
    pids: list[int] = []
    try:
        rc, stderr, elapsed, row.cli_peak = run_rusage(cmd, args.mount_timeout)
        pids = pids_for_mount(mnt)
        if rc is None:
            row.mount_dnf = args.mount_timeout
            row.add(f"CLI did not return within {args.mount_timeout:.0f} s; log {logf}")
            return row
        if rc != 0:
            err = (stderr.strip().splitlines() or ["(no stderr)"])[-1]
            row.add(f"CLI exit {rc}: {err}; log {logf}")
            log(f"  FAILED: {err}\n  daemon log: {log_tail(logf)}")
            return row
        if not wait_answers(mnt, ".zgroup", 5):
            row.add(f"CLI returned 0 but the mount does not answer; log {logf}")
            return row
        row.mount_s = elapsed
        if len(pids) != 1:
            row.add(f"daemon pids by cmdline: {pids}")
        if not pids:
            return row
        log(f"  mount answered in {elapsed:.2f} s (daemon pid {pids[0]}, "
            f"CLI peak {fmt_mib(row.cli_peak)} MiB)")
        measure_mount(row, mnt, pids[0], args, log)
        if "died" in row.note or "!=" in row.note or "stat:" in row.note:
            log(f"  daemon log tail: {log_tail(logf)}")
        return row
    finally:
        t0 = time.perf_counter()
        unmount(mnt, pids or pids_for_mount(mnt), log)
        row.umount_s = time.perf_counter() - t0


def bench_fsspec_fuse(ds: Dataset, mnt: Path, args, log, skip: str = "") -> Row:
    row = Row(ds, "fsspec.fuse (fusepy)", "fuse")
    if skip:
        row.mount_dnf = args.fuse_timeout
        row.add(skip)
        return row
    try:
        import fuse  # noqa: F401  (fusepy, imported by fsspec.fuse)
    except (ImportError, OSError) as e:
        row.add(f"skipped: fusepy/libfuse2 unavailable ({e}); run scripts/setup.sh --bench")
        return row
    mnt.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, __file__, "_fsspec_fuse", ds.fmt, str(ds.source), str(mnt)]
    log(f"[{ds.title} / fsspec.fuse] {shlex.join(cmd)}")
    errpath = mnt.parent / "logs" / f"fsspec-fuse-{ds.fmt}-{ds.n}.log"
    errpath.parent.mkdir(exist_ok=True)
    errlog = open(errpath, "w")  # noqa: SIM115
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=errlog, stderr=errlog, stdin=subprocess.DEVNULL)
    hwm = [0]

    def tick() -> None:
        hwm[0] = max(hwm[0], proc_status(proc.pid).get("VmHWM", 0))

    try:
        if not wait_answers(mnt, ".zgroup", args.fuse_timeout, proc, on_tick=tick):
            tick()
            row.rss_peak = hwm[0] or None
            if proc.poll() is None:
                row.mount_dnf = args.fuse_timeout
                row.add(f"not ready within {args.fuse_timeout:.0f} s (peak RSS so far shown)")
            else:
                row.add(f"exited {proc.returncode} before answering, see {errpath}")
            return row
        row.mount_s = time.perf_counter() - t0
        log(f"  mount answered in {row.mount_s:.2f} s (pid {proc.pid})")
        measure_mount(row, mnt, proc.pid, args, log)
        return row
    finally:
        t0 = time.perf_counter()
        unmount(mnt, [proc.pid], log)
        row.umount_s = time.perf_counter() - t0
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        errlog.close()


def bench_fsspec_inproc(ds: Dataset, work: Path, args, log) -> tuple[Row, str]:
    """The in-process row, and a reason to skip the FUSE bridge ("" if none)."""
    name = "fsspec in-process" + (" (simple_templates=False)" if ds.fmt == "gen" else "")
    row = Row(ds, name, "inproc")
    sample_file = work / "sample.json"
    sample_file.write_text(json.dumps(ds.sample))
    cmd = [sys.executable, __file__, "_fsspec_inproc", ds.fmt, str(ds.source), str(sample_file)]
    cmd += [str(args.inproc_timeout)]
    log(f"[{ds.title} / fsspec in-process] {shlex.join(cmd)}")
    hwm = 0
    timed_out = False
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + args.inproc_timeout
        while proc.poll() is None:
            hwm = max(hwm, proc_status(proc.pid).get("VmHWM", 0))
            if time.monotonic() > deadline:
                timed_out = True
                proc.kill()
                proc.wait()
                break
            time.sleep(0.1)
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
    res: dict = {}
    for line in stdout.splitlines():
        with contextlib.suppress(json.JSONDecodeError):
            res.update(json.loads(line))
    skip_fuse = ""
    if "defaults_keys" in res:
        row.add(f"with fsspec's defaults gen is dropped: {res['defaults_keys']:,} keys")
    if "calib_rate" in res:
        est = ds.n / res["calib_rate"]
        row.add(
            f"gen expansion {res['calib_rate']:,.0f} products/s on {GEN_CALIBRATION:,} products"
            f" -> est. {est:,.0f} s for {ds.n:,}"
        )
        if res.get("skipped"):
            row.mount_dnf = args.inproc_timeout
            row.add(f"full expansion not started: estimate > {args.inproc_timeout:.0f} s bound")
        if est > args.fuse_timeout:
            skip_fuse = (
                f"not started: fsspec must first expand the gen (est. {est:,.0f} s, see the "
                f"in-process row) > {args.fuse_timeout:.0f} s bound"
            )
    row.rss_peak = res.get("hwm") or hwm or None
    if "construct_s" in res:
        row.mount_s = res["construct_s"]
        row.rss_steady = res["rss_after_construct"]
    elif timed_out and not res.get("skipped"):
        row.mount_dnf = args.inproc_timeout
    if "info_rate" in res:
        row.stat_rate = res["info_rate"]
        if res.get("info_problems"):
            row.add(f"fs.info: {res['info_problems']}")
    if "find_s" in res:
        row.find_s, row.find_count = res["find_s"], res["find_count"]
        row.add(f"find = fs.find(''): files only, {ds.keys:,} keys in the set")
    elif "construct_s" in res:
        row.find_dnf = args.inproc_timeout
    if timed_out:
        row.add(f"killed at the {args.inproc_timeout:.0f} s bound")
    elif proc.returncode != 0:
        row.add(f"failed (exit {proc.returncode}): {(stderr.strip().splitlines() or ['?'])[-1]}")
    log(f"  in-process: {res}")
    return row, skip_fuse


# Hidden sub-commands, run in their own process (so their RSS is isolated).


def _make_fs(fmt: str, source: str):
    from fsspec.implementations.reference import ReferenceFileSystem

    if fmt == "gen":
        return ReferenceFileSystem(fo=source, simple_templates=False)
    return ReferenceFileSystem(fo=source)


def _child_fsspec_fuse(fmt: str, source: str, mnt: str) -> None:
    from fsspec.fuse import FUSEr, run

    class RootlessFUSEr(FUSEr):
        """FUSEr joins root + path; keys of a reference set have no leading slash."""

        def __init__(self, fs, path, ready_file=False):
            super().__init__(fs, path, ready_file=ready_file)
            self.root = ""

    run(_make_fs(fmt, source), "", mnt, foreground=True, ops_class=RootlessFUSEr)


def _child_fsspec_inproc(fmt: str, source: str, sample_file: str, bound: float) -> None:
    from fsspec.implementations.reference import ReferenceFileSystem

    def emit(**kw) -> None:
        print(json.dumps(kw), flush=True)

    if fmt == "gen":
        fs = ReferenceFileSystem(fo=source)  # fsspec's defaults: simple_templates=True
        emit(defaults_keys=len(fs.references))
        doc = json.loads(Path(source).read_text())
        n = math.prod(d["stop"] for d in doc["gen"][0]["dimensions"].values())
        small = gen_doc(GEN_CALIBRATION)
        t0 = time.perf_counter()
        fs = ReferenceFileSystem(fo=small, simple_templates=False)
        rate = GEN_CALIBRATION / (time.perf_counter() - t0)
        assert len(fs.references) == GEN_CALIBRATION + 4, len(fs.references)
        del fs
        emit(calib_rate=rate)
        if n / rate > bound:
            emit(skipped=True, hwm=proc_status(os.getpid()).get("VmHWM"))
            return
    sample = json.loads(Path(sample_file).read_text())
    t0 = time.perf_counter()
    fs = _make_fs(fmt, source)
    t1 = time.perf_counter()
    emit(construct_s=t1 - t0, rss_after_construct=proc_status(os.getpid()).get("VmRSS"))
    errors = 0
    wrong = {True: 0, False: 0}
    t0 = time.perf_counter()
    for key, size in sample:
        try:
            if fs.info(key)["size"] != size:
                wrong[is_meta(key)] += 1
        except Exception:
            errors += 1
    rate = len(sample) / (time.perf_counter() - t0)
    emit(info_rate=rate, info_problems=size_problems(errors, wrong, len(sample)))
    t0 = time.perf_counter()
    files = fs.find("")
    emit(find_s=time.perf_counter() - t0, find_count=len(files))
    emit(hwm=proc_status(os.getpid()).get("VmHWM"))


# --------------------------------------------------------------------------------------------
# Goals (issue 3, "Scale") -- refmount rows only
# --------------------------------------------------------------------------------------------

# (format, keys or None for every size, row kinds, metric, limit, label)
GOALS = [
    ("parquet", 10_000_000, ("first",), "ready", 2.0, "ready < 2 s"),
    ("parquet", 10_000_000, ("first",), "steady", 200 * MiB, "steady RSS < 200 MiB"),
    ("json", 10_000_000, ("first",), "ready", 25.0, "ready < 25 s"),
    ("json", 10_000_000, ("first",), "peak", 2 * GiB, "peak RSS (daemon, CLI) < 2 GiB"),
    ("json", 10_000_000, ("first",), "steady", 500 * MiB, "steady RSS < 500 MiB"),
    ("json", None, ("second",), "ready", 3.0, "2nd mount ready < 3 s"),
    ("json", None, ("second",), "steady", 200 * MiB, "2nd mount steady RSS < 200 MiB"),
    ("gen", None, ("second",), "ready", 3.0, "2nd mount ready < 3 s"),
    ("gen", None, ("second",), "steady", 200 * MiB, "2nd mount steady RSS < 200 MiB"),
    ("gen", 1_000_000, ("first",), "ready", 10.0, "ready < 10 s"),
    ("json", 1_000_000, ("first",), "ready", 3.0, "ready < 3 s"),
    ("json", 1_000_000, ("first",), "steady", 150 * MiB, "steady RSS < 150 MiB"),
    ("json", 1_000_000, ("first",), "find", 5.0, "find < 5 s"),
]


def metric(row: Row, name: str) -> float | None:
    if name == "ready":
        return row.mount_s
    if name == "steady":
        return row.rss_steady
    if name == "find":
        return row.find_s
    if name == "peak":
        vals = [v for v in (row.rss_peak, row.cli_peak) if v is not None]
        return max(vals) if vals else None
    raise ValueError(name)


def check_goals(row: Row) -> None:
    for fmt, keys, kinds, name, limit, label in GOALS:
        if fmt != row.ds.fmt or row.kind not in kinds or (keys is not None and keys != row.ds.n):
            continue
        v = metric(row, name)
        row.goals.append((label, v is not None and v < limit))


# --------------------------------------------------------------------------------------------
# Report
# --------------------------------------------------------------------------------------------


def fmt_mib(v: int | None) -> str:
    return "-" if v is None else f"{v / MiB:,.0f}"


def fmt_s(v: float | None, dnf: float | None = None) -> str:
    if dnf is not None:
        return f"DNF >{dnf:.0f}s"
    return "-" if v is None else f"{v:.2f}"


def table(rows: list[Row]) -> str:
    head = [
        "set",
        "peer",
        "mount answers (s)",
        "steady RSS (MiB)",
        "peak RSS (MiB)",
        "CLI peak RSS (MiB)",
        "find \\| wc -l (s)",
        "entries",
        "server CPU in find (s)",
        "random stat/s",
        "unmount (s)",
        "load 1m",
        "goals",
        "notes",
    ]
    body = []
    for r in rows:
        goals = "; ".join(f"{'MET' if ok else 'MISSED'}: {label}" for label, ok in r.goals)
        body.append(
            [
                r.ds.title,
                r.name,
                fmt_s(r.mount_s, r.mount_dnf),
                fmt_mib(r.rss_steady),
                fmt_mib(r.rss_peak),
                fmt_mib(r.cli_peak),
                fmt_s(r.find_s, r.find_dnf),
                "-" if r.find_count is None else f"{r.find_count:,}",
                fmt_s(r.find_cpu),
                "-" if r.stat_rate is None else f"{r.stat_rate:,.0f}",
                fmt_s(r.umount_s),
                "-" if r.load is None else f"{r.load[0]:.1f}→{r.load[1]:.1f}",
                goals,
                r.note.strip(" ;"),
            ]
        )
    widths = [max(len(h), *(len(b[i]) for b in body)) for i, h in enumerate(head)]

    def line(cells):
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths, strict=True)) + " |"

    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep, *(line(b) for b in body)])


def goal_summary(rows: list[Row]) -> list[str]:
    out = []
    for fmt, keys, kinds, name, limit, label in GOALS:
        hits = [r for r in rows if r.ds.fmt == fmt and r.kind in kinds and (keys is None or r.ds.n == keys)]
        where = f"{FORMAT_TITLES[fmt]} {human(keys) if keys else '(every size)'}"
        if not hits:
            out.append(f"  [not run]  {where}: {label}")
            continue
        for r in hits:
            v = metric(r, name)
            timed = name in ("ready", "find")
            shown = "-" if v is None else f"{v:.2f} s" if timed else f"{v / MiB:,.0f} MiB"
            if name == "find" and r.find_dnf is not None:
                shown = f"DNF >{r.find_dnf:.0f} s"
            ok = v is not None and v < limit
            out.append(f"  [{'MET' if ok else 'MISSED':6}] {r.ds.title}, {r.name}: {label} -- {shown}")
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "_fsspec_fuse":
        _child_fsspec_fuse(*argv[1:4])
        return 0
    if argv and argv[0] == "_fsspec_inproc":
        _child_fsspec_inproc(argv[1], argv[2], argv[3], float(argv[4]))
        return 0

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--keys", default="1000000,10000000", help="comma list of sizes (keys / products)")
    ap.add_argument("--quick", action="store_true", help="10,000 keys, shorter bounds (smoke run)")
    ap.add_argument("--formats", default=",".join(FORMATS), help="comma list of json,parquet,gen")
    ap.add_argument(
        "--only", default="refmount,fsspec,fsspec-fuse", help="comma list of refmount,fsspec,fsspec-fuse"
    )
    ap.add_argument("--arrays", type=int, default=10)
    ap.add_argument("--targets", type=int, default=300, help="distinct target files")
    ap.add_argument("--record-size", type=int, default=10_000, help="Parquet record_size")
    ap.add_argument("--workdir", type=Path, default=REPO / "bench-work" / "scale")
    ap.add_argument("--stats", type=int, default=10_000, help="random os.stat calls")
    ap.add_argument("--stats-budget", type=float, default=60.0, help="seconds for the random stats")
    ap.add_argument("--find-timeout", type=float, default=300.0)
    ap.add_argument("--mount-timeout", type=float, default=300.0, help="bound of the refmount CLI")
    ap.add_argument("--fuse-timeout", type=float, default=120.0, help="bound of fsspec.fuse readiness")
    ap.add_argument("--inproc-timeout", type=float, default=300.0, help="bound of fsspec in-process")
    ap.add_argument("--settle", type=float, default=3.0, help="seconds before steady RSS")
    ap.add_argument("--regen", action="store_true", help="regenerate the reference sets")
    ap.add_argument("--generate-only", action="store_true", help="only generate the inputs")
    args = ap.parse_args(argv)
    if args.quick:
        args.keys = "10000"
        args.find_timeout = min(args.find_timeout, 60.0)
        args.fuse_timeout = min(args.fuse_timeout, 60.0)
        args.inproc_timeout = min(args.inproc_timeout, 120.0)
    sizes = [int(k.replace("_", "")) for k in args.keys.split(",") if k]
    formats = [f for f in args.formats.split(",") if f]
    only = set(args.only.split(","))
    if bad := set(formats) - set(FORMATS):
        ap.error(f"unknown formats: {sorted(bad)}")
    if bad := only - {"refmount", "fsspec", "fsspec-fuse"}:
        ap.error(f"unknown peers: {sorted(bad)}")

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

    work = args.workdir.resolve()
    (work / "logs").mkdir(parents=True, exist_ok=True)
    mnt = work / "mnt"
    t_start = time.perf_counter()
    load_start = os.getloadavg()

    check = ""
    if "parquet" in formats:
        log("checking the Parquet writer against LazyReferenceMapper ...")
        check = verify_parquet_layout(work)
        log(f"  {check}")

    rows: list[Row] = []
    descs: list[str] = []

    def add(row: Row, load0: float) -> None:
        row.load = (load0, load1())
        check_goals(row)
        rows.append(row)

    try:
        for n in sizes:
            for fmt in formats:
                ds = prepare(fmt, n, args, work, log)
                descs.append(
                    f"{ds.title}: {ds.desc}; {ds.keys:,} keys, expected find lines {ds.expected_find:,}"
                )
                if args.generate_only:
                    log(f"  {descs[-1]}")
                    continue
                tag = f"{fmt}-{n}"
                if "refmount" in only:
                    l0 = load1()
                    logf = work / "logs" / f"refmount-{tag}-nocache.log"
                    add(bench_refmount(ds, "refmount -o no_disk_cache", "first", mnt,
                                       "no_disk_cache", logf, args, log), l0)
                    if fmt != "parquet":
                        cache = work / f"cache-{tag}"
                        shutil.rmtree(cache, ignore_errors=True)
                        cache.mkdir()
                        for i, label in enumerate(("1st mount, parses", "2nd mount, cached index")):
                            l0 = load1()
                            logf = work / "logs" / f"refmount-{tag}-cache{i + 1}.log"
                            add(bench_refmount(ds, f"refmount -o cache_dir ({label})",
                                               ("first", "second")[i], mnt, f"cache_dir={cache}",
                                               logf, args, log), l0)
                        shutil.rmtree(cache, ignore_errors=True)
                        cache.mkdir()
                        l0 = load1()
                        logf = work / "logs" / f"refmount-{tag}-foreground.log"
                        add(bench_refmount_foreground(ds, "refmount -f -o cache_dir (1st mount, parses)",
                                                      mnt, f"cache_dir={cache}", logf, args, log), l0)
                        shutil.rmtree(cache, ignore_errors=True)
                skip_fuse = ""
                if "fsspec" in only:
                    l0 = load1()
                    row, skip_fuse = bench_fsspec_inproc(ds, work, args, log)
                    add(row, l0)
                if "fsspec-fuse" in only:
                    l0 = load1()
                    add(bench_fsspec_fuse(ds, mnt, args, log, skip_fuse), l0)
                log("table so far:\n" + table(rows))
    finally:
        if is_mounted(mnt):
            unmount(mnt, pids_for_mount(mnt), log)

    if args.generate_only:
        return 0
    cmdline = shlex.join(
        [os.path.relpath(sys.executable, Path.cwd()), os.path.relpath(__file__, Path.cwd()), *argv]
    )
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    print()
    print(f"$ {cmdline}")
    print(
        f"machine: {os.cpu_count()} cores, {mem:.0f} GiB, Linux {os.uname().release}, "
        f"Python {sys.version.split()[0]}; load average 1/5/15 min at start "
        f"{'/'.join(f'{x:.1f}' for x in load_start)}, at end "
        f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}; run took "
        f"{(time.perf_counter() - t_start) / 60:.1f} min"
    )
    print("reference sets (under " + os.path.relpath(work, Path.cwd()) + "):")
    for d in descs:
        print(f"  {d}")
    if check:
        print(check)
    print()
    print(table(rows))
    print()
    print(
        "mount answers: exec of `refmount SOURCE MNT -o ...` until it returns 0 (the mount then\n"
        "  answers); fsspec.fuse: start of its process until stat(MNT/.zgroup) succeeds;\n"
        "  in-process: the ReferenceFileSystem(...) constructor. DNF >Ns: stopped at the bound.\n"
        f"steady RSS: the serving process's VmRSS {args.settle:g} s after the mount answers (in-process:\n"
        "  right after construction); peak RSS: its VmHWM after all workloads. CLI peak RSS: the\n"
        "  refmount command's own peak (wait4 ru_maxrss): it parses before spawning the daemon.\n"
        f"random stat: {args.stats:,} os.stat() of random keys (1% metadata), run before find (cold\n"
        f"  kernel caches), st_size checked, budget {args.stats_budget:g} s; in-process: fs.info().\n"
        "find: `find MNT | wc -l` = keys + directories + root, checked against the expected count\n"
        f"  (bound {args.find_timeout:g} s); server CPU: the serving process's CPU seconds during find.\n"
        "unmount: fusermount3 -u until the server process is gone (after a full find the kernel\n"
        "  drops every cached inode of the mount in the umount call).\n"
        "load 1m: the 1-minute load average at the start and at the end of the row.\n"
        "Parquet metadata keys are expected as refmount documents them (Python's json.dumps of the\n"
        "  .zmetadata value); fsspec's reference module uses ujson when it is installed"
        f" ({'installed here' if importlib.util.find_spec('ujson') else 'not installed here'}),\n"
        "  which writes compact JSON: wrong st_size on metadata keys of fsspec rows is that difference."
    )
    print()
    print("goals (issue 3, refmount rows):")
    print("\n".join(goal_summary(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
