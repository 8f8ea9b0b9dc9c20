"""The ``scale`` workload: reference sets of millions of keys, refmount vs. fsspec.

For every size in ``--keys`` (default 1,000,000 and 10,000,000) and every ``--formats``:

* ``json``: a zarr-like Version 0 set of N keys (``tests/support/scaleset.py``): ~10 arrays,
  chunk keys ``varKK/i.j`` = ``[url, offset, length]`` into a few hundred sparse local files;
* ``parquet``: the same keys in fsspec's LazyReferenceMapper layout (``record_size`` 10,000),
  written with pyarrow directly and first checked against ``LazyReferenceMapper.create`` +
  ``flush`` on a small set (same files, same rows) and read back by ``ReferenceFileSystem``;
* ``gen``: a Version 1 file with one ``gen`` entry of N products plus four metadata keys.

Inputs are generated once under the work directory and reused. Peers (rows): refmount
(``-o no_disk_cache``; for JSON and gen also a fresh ``cache_dir`` mounted twice, the second
mount reusing the index, and ``-f``, the systemd mode); inproc (``ReferenceFileSystem`` in a
process of its own; for gen ``simple_templates=False``, since with fsspec's defaults ``gen``
is dropped, and the expansion rate first measured on 5,000 products: when the estimate
exceeds the bound the full expansion is not started); fsspec-fuse (``fsspec.fuse.run``).

Columns: time until the mount answers, the serving process's RSS after settling and its peak,
the refmount CLI's own peak RSS, ``find MNT | wc -l`` time and count (checked), the server's CPU
during that ``find``, random ``os.stat`` per second (before ``find``, ``st_size`` checked), the
1-minute load average, and the goals next to the numbers. Every step is bounded
(``--mount-timeout``, ``--find-timeout``, ``--stats-budget``, ``--inproc-timeout``,
``--fuse-timeout``); a peer that does not finish shows ``DNF >Ns``.
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
from typing import Any

import numpy as np

from bench import harness as h
from bench.report import Table

sys.path.insert(0, str(h.REPO / "tests"))
from support.scaleset import Layout, generate_v0

MiB = 1024 * 1024
GiB = 1024 * MiB
WORKLOADS = {"scale": "Version 0 JSON, Parquet and Version 1 gen sets of 1M and 10M keys: "
             "ready, RSS, find, random stat"}
PEERS = ("refmount", "inproc", "fsspec-fuse")
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
    row.rss_steady = h.proc_status(pid).get("VmRSS")
    log(f"  steady RSS {fmt_mib(row.rss_steady)} MiB; {len(ds.sample):,} random stats ...")
    rate, done, problems = run_stats(mnt, ds.sample, args.stats_budget)
    row.stat_rate = rate
    if done < len(ds.sample):
        row.add(f"stats: {done:,} of {len(ds.sample):,} within {args.stats_budget:g} s")
    if problems:
        row.add(f"stat: {problems}")
    log(f"  stat {rate:,.0f}/s ({problems or 'all sizes right'}); find ...")
    cpu0 = h.proc_cpu(pid)
    row.find_s, row.find_count = run_find(mnt, args.find_timeout)
    cpu1 = h.proc_cpu(pid)
    if cpu0 is not None and cpu1 is not None:
        row.find_cpu = cpu1 - cpu0
    if row.find_s is None:
        row.find_dnf = args.find_timeout
    elif row.find_count != ds.expected_find:
        why = ds.other_counts.get(row.find_count, "")
        row.add(f"find count {row.find_count:,} != expected {ds.expected_find:,}{f' ({why})' if why else ''}")
    if not h.pid_alive(pid):
        row.add("server process died")
    row.rss_peak = h.proc_status(pid).get("VmHWM")
    log(
        f"  find {fmt_s(row.find_s, row.find_dnf)}, {row.find_count} entries; "
        f"peak RSS {fmt_mib(row.rss_peak)} MiB"
    )


# --------------------------------------------------------------------------------------------
# Peers
# --------------------------------------------------------------------------------------------


def log_tail(path: Path, n: int = 5) -> str:
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(lines[-n:])


def bench_refmount(ds: Dataset, name: str, kind: str, mnt: Path, opts: str, logf: Path, args, log,
                   foreground: bool = False) -> Row:
    """A refmount row: detached (the CLI's time until it returns, its own peak RSS) or, with
    ``foreground``, ``refmount -f`` (the started process serves, as under refmount@.service;
    the parse runs in a child, so there is no CLI peak)."""
    row = Row(ds, name, kind)
    log(f"[{ds.title} / {name}]")
    try:
        m = h.mount_refmount(ds.source, mnt, [opts, f"log={logf}"], args.mount_timeout, log,
                             foreground=foreground)
    except h.Failed as e:
        row.mount_dnf = args.mount_timeout if str(e).startswith("DNF") else None
        row.add(f"{e}; log {logf}")
        log(f"  FAILED: {e}\n  daemon log: {log_tail(logf)}")
        return row
    try:
        row.mount_s, row.cli_peak = m.seconds, m.cli_peak
        log(f"  mount answered in {m.seconds:.2f} s (serving pid {m.cpu_pid}, "
            f"CLI peak {fmt_mib(row.cli_peak)} MiB)")
        measure_mount(row, mnt, m.cpu_pid, args, log)
        if "died" in row.note or "!=" in row.note or "stat:" in row.note:
            log(f"  daemon log tail: {log_tail(logf)}")
        return row
    finally:
        t0 = time.perf_counter()
        m.unmount(log)
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
    log(f"[{ds.title} / fsspec.fuse]")
    errpath = mnt.parent / "logs" / f"fsspec-fuse-{ds.fmt}-{ds.n}.log"
    hwm = [0]

    def tick(pid: int) -> None:
        hwm[0] = max(hwm[0], h.proc_status(pid).get("VmHWM", 0))

    try:
        m = h.mount_fsspec_fuse(ds.source, mnt, errpath, args.fuse_timeout, fs=fs_options(ds.fmt),
                                on_tick=tick)
    except h.Failed as e:
        row.rss_peak = hwm[0] or None
        if str(e).startswith("DNF"):
            row.mount_dnf = args.fuse_timeout
            row.add(f"not ready within {args.fuse_timeout:.0f} s (peak RSS so far shown)")
        else:
            row.add(f"{e}, see {errpath}")
        return row
    try:
        row.mount_s = m.seconds
        log(f"  mount answered in {row.mount_s:.2f} s (pid {m.cpu_pid})")
        measure_mount(row, mnt, m.cpu_pid, args, log)
        return row
    finally:
        t0 = time.perf_counter()
        m.unmount(log)
        row.umount_s = time.perf_counter() - t0


def bench_fsspec_inproc(ds: Dataset, work: Path, args, log) -> tuple[Row, str]:
    """The in-process row, and a reason to skip the FUSE bridge ("" if none)."""
    name = "fsspec in-process" + (" (simple_templates=False)" if ds.fmt == "gen" else "")
    row = Row(ds, name, "inproc")
    sample_file = work / "sample.json"
    sample_file.write_text(json.dumps(ds.sample))
    spec = {"fmt": ds.fmt, "source": str(ds.source), "sample": str(sample_file), "bound": args.inproc_timeout}
    cmd = [h.PY, "-m", "bench.children", "scale_inproc", json.dumps(spec)]
    log(f"[{ds.title} / fsspec in-process] {shlex.join(cmd)}")
    hwm = 0
    timed_out = False
    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=h.checkout_env())
        deadline = time.monotonic() + args.inproc_timeout
        while proc.poll() is None:
            hwm = max(hwm, h.proc_status(proc.pid).get("VmHWM", 0))
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


def fs_options(fmt: str) -> dict[str, Any]:
    """ReferenceFileSystem's options for a set (Version 1 ``gen`` needs simple_templates=False)."""
    return {"remote_protocol": None, "skip_instance_cache": False, "simple_templates": fmt != "gen"}


def _make_fs(fmt: str, source: str):
    from fsspec.implementations.reference import ReferenceFileSystem

    return ReferenceFileSystem(fo=source, **fs_options(fmt))


def child_inproc(spec: dict[str, Any]) -> None:
    """The in-process peer, in a process of its own (``bench.children scale_inproc``)."""
    from fsspec.implementations.reference import ReferenceFileSystem

    fmt, source, sample_file, bound = spec["fmt"], spec["source"], spec["sample"], spec["bound"]

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
            emit(skipped=True, hwm=h.proc_status(os.getpid()).get("VmHWM"))
            return
    sample = json.loads(Path(sample_file).read_text())
    t0 = time.perf_counter()
    fs = _make_fs(fmt, source)
    t1 = time.perf_counter()
    emit(construct_s=t1 - t0, rss_after_construct=h.proc_status(os.getpid()).get("VmRSS"))
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
    emit(hwm=h.proc_status(os.getpid()).get("VmHWM"))


# --------------------------------------------------------------------------------------------
# Goals -- refmount rows only
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


def table(rows: list[Row]) -> Table:
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
    return Table("scale", "refmount at scale", head, body, align="ll" + "r" * (len(head) - 4) + "ll")


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


def add_arguments(p: Any) -> None:
    p.add_argument("--keys", default="1000000,10000000", help="comma list of sizes (keys / products)")
    p.add_argument("--formats", default=",".join(FORMATS), help="comma list of json,parquet,gen")
    p.add_argument("--arrays", type=int, default=10)
    p.add_argument("--targets", type=int, default=300, help="distinct target files")
    p.add_argument("--record-size", type=int, default=10_000, help="Parquet record_size")
    p.add_argument("--stats", type=int, default=10_000, help="random os.stat calls")
    p.add_argument("--stats-budget", type=float, default=60.0, help="seconds for the random stats")
    p.add_argument("--find-timeout", type=float, default=300.0)
    p.add_argument("--mount-timeout", type=float, default=300.0, help="bound of the refmount CLI")
    p.add_argument("--fuse-timeout", type=float, default=120.0, help="bound of fsspec.fuse readiness")
    p.add_argument("--inproc-timeout", type=float, default=300.0, help="bound of fsspec in-process")
    p.add_argument("--settle", type=float, default=3.0, help="seconds before steady RSS")
    p.add_argument("--regen", action="store_true", help="regenerate the reference sets")
    p.add_argument("--generate-only", action="store_true", help="only generate the inputs")


def run(args: argparse.Namespace, workloads: list[str], peers: list[str], work: Path) -> list[Table]:
    if args.quick:
        args.keys = "10000"
        args.find_timeout = min(args.find_timeout, 60.0)
        args.fuse_timeout = min(args.fuse_timeout, 60.0)
        args.inproc_timeout = min(args.inproc_timeout, 120.0)
    sizes = [int(k.replace("_", "")) for k in args.keys.split(",") if k]
    formats = [f for f in args.formats.split(",") if f]
    if bad := set(formats) - set(FORMATS):
        raise SystemExit(f"unknown formats: {sorted(bad)}")

    def log(msg: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {msg}", file=sys.stderr, flush=True)

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
    caches = h.CacheDirs(work / "cache")

    def add(row: Row, load0: float) -> None:
        h.wait_idle(args.quiet_wait, args.quiet_load)  # before the next row
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
                if "refmount" in peers:
                    l0 = load1()
                    logf = work / "logs" / f"refmount-{tag}-nocache.log"
                    add(bench_refmount(ds, "refmount -o no_disk_cache", "first", mnt,
                                       "no_disk_cache", logf, args, log), l0)
                    if fmt != "parquet":
                        cache = caches.fresh(tag)
                        for i, label in enumerate(("1st mount, parses", "2nd mount, cached index")):
                            l0 = load1()
                            logf = work / "logs" / f"refmount-{tag}-cache{i + 1}.log"
                            add(bench_refmount(ds, f"refmount -o cache_dir ({label})",
                                               ("first", "second")[i], mnt, f"cache_dir={cache}",
                                               logf, args, log), l0)
                        cache = caches.fresh(tag)
                        l0 = load1()
                        logf = work / "logs" / f"refmount-{tag}-foreground.log"
                        add(bench_refmount(ds, "refmount -f -o cache_dir (1st mount, parses)", "first", mnt,
                                           f"cache_dir={cache}", logf, args, log, foreground=True), l0)
                skip_fuse = ""
                if "inproc" in peers:
                    l0 = load1()
                    row, skip_fuse = bench_fsspec_inproc(ds, work, args, log)
                    add(row, l0)
                if "fsspec-fuse" in peers:
                    l0 = load1()
                    add(bench_fsspec_fuse(ds, mnt, args, log, skip_fuse), l0)
                log("table so far:\n" + table(rows).markdown())
    finally:
        h.fuse_unmount(mnt, [], log)
        caches.cleanup()

    if args.generate_only:
        return []
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GiB
    t = table(rows)
    t.notes = [
        f"machine: {os.cpu_count()} cores, {mem:.0f} GiB, Linux {os.uname().release}, "
        f"Python {sys.version.split()[0]}; load average 1/5/15 min at start "
        f"{'/'.join(f'{x:.1f}' for x in load_start)}, at end "
        f"{'/'.join(f'{x:.1f}' for x in os.getloadavg())}; run took "
        f"{(time.perf_counter() - t_start) / 60:.1f} min",
        "reference sets (under " + os.path.relpath(work, Path.cwd()) + "):",
        *(f"  {d}" for d in descs),
        *([check] if check else []),
        "",
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
        "  which writes compact JSON: wrong st_size on metadata keys of fsspec rows is that difference.",
        "",
        "goals (refmount rows):",
        *goal_summary(rows),
    ]
    return [t]
