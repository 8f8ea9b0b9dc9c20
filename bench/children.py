"""The measuring children: ``python -m bench.children KIND JSON`` runs one measurement in a
process of its own (so that it can be bounded by a timeout and stopped by its PID) and prints
one JSON line per measured pass; ``{"fatal": ...}`` when it failed."""

from __future__ import annotations

import itertools
import json
import os
import resource
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

MiB = 1024 * 1024


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def run_readers(n: int, threads: int, read_one: Callable[[int], int]) -> dict[str, Any]:
    """Items 0..n-1 shared by ``threads`` threads (in order of claim); wall time and bytes."""
    counter = itertools.count()
    total = [0] * threads
    errors: list[str] = []
    n_err = [0]
    lock = threading.Lock()
    start = threading.Barrier(threads + 1)

    def worker(w: int) -> None:
        start.wait()
        got = 0
        while True:
            i = next(counter)
            if i >= n:
                break
            try:
                got += read_one(i)
            except Exception as e:
                with lock:
                    n_err[0] += 1
                    if len(errors) < 3:
                        errors.append(f"item {i}: {type(e).__name__}: {e}"[:300])
        total[w] = got

    ts = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(threads)]
    for t in ts:
        t.start()
    c0 = time.process_time()
    start.wait()
    t0 = time.perf_counter()
    for t in ts:
        t.join()
    elapsed = time.perf_counter() - t0
    return {"elapsed": elapsed, "bytes": sum(total), "items": n, "errors": n_err[0],
            "first_errors": errors, "cpu": time.process_time() - c0}


def _sample_ids(n: int, k: int = 16) -> set[int]:
    import random

    return set(random.Random(n).sample(range(n), min(k, n)))


def child_files(spec: dict[str, Any]) -> None:
    """Unbuffered ``open().read()`` of DIR/PREFIX{i} for i < n with ``threads`` threads (no
    buffer: Python then does not ask ``isatty``, a request to the daemon at each open)."""
    base = spec["dir"]
    prefix = spec["prefix"]
    length = spec["length"]
    local = spec["local"]
    sample = _sample_ids(spec["n"])
    kept: dict[int, bytes] = {}

    def read_one(i: int) -> int:
        with open(os.path.join(base, f"{prefix}{i}"), "rb", buffering=0) as f:
            data = f.read()
        if i in sample:
            kept[i] = data
        return len(data)

    res = run_readers(spec["n"], spec["threads"], read_one)
    bad = 0
    with open(local, "rb") as f:
        for i, data in kept.items():
            if data != os.pread(f.fileno(), length, i * length):
                bad += 1
    res["verified"] = f"{len(kept) - bad}/{len(kept)} sampled files match"
    res["verify_failed"] = bad > 0
    emit(res)


def child_local(spec: dict[str, Any]) -> None:
    """The same reads from the local file: open + pread + close per item."""
    path = spec["local"]
    length = spec["length"]

    def read_one(i: int) -> int:
        fd = os.open(path, os.O_RDONLY)
        try:
            return len(os.pread(fd, length, i * length))
        finally:
            os.close(fd)

    emit(run_readers(spec["n"], spec["threads"], read_one))


def child_inproc(spec: dict[str, Any]) -> None:
    """In-process fsspec (ReferenceFileSystem over HTTP): ``passes`` passes on one instance."""
    fs = _refs_fs(spec["refs"])
    mode = spec["mode"]
    for p in range(spec["passes"]):
        if mode == "seq":
            c0 = time.process_time()
            t0 = time.perf_counter()
            got = 0
            with fs.open("data.bin", "rb") as f:
                while chunk := f.read(MiB):
                    got += len(chunk)
            res = {"elapsed": time.perf_counter() - t0, "bytes": got, "items": 1, "errors": 0,
                   "cpu": time.process_time() - c0}
        elif mode == "batch":
            keys = [f"{spec['prefix']}{i}" for i in range(spec["n"])]
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = fs.cat(keys)
            res = {"elapsed": time.perf_counter() - t0, "bytes": sum(len(v) for v in out.values()),
                   "items": len(out), "errors": 0, "cpu": time.process_time() - c0}
        else:
            prefix = spec["prefix"]
            res = run_readers(spec["n"], spec["threads"],
                              lambda i, prefix=prefix: len(fs.cat_file(f"{prefix}{i}")))
        res["pass"] = p
        emit(res)



def child_zarr(spec: dict[str, Any]) -> None:
    """Read a whole zarr array: through a mount (LocalStore) or in-process (fsspec mapper)."""
    import numpy as np
    import zarr

    if spec["store"] == "mount":
        store: Any = zarr.storage.LocalStore(os.path.join(spec["root"], spec["array"]), read_only=True)
    else:
        import fsspec

        # zarr 3 turns a mapper over a *sync* ReferenceFileSystem into an async copy and fails
        # ("Reference-FS's target filesystem must have same value of asynchronous"): build the
        # mapper over an asynchronous ReferenceFileSystem (and HTTP filesystem) instead.
        store = fsspec.get_mapper(f"reference://{spec['array']}", fo=spec["refs"], remote_protocol="http",
                                  remote_options={"asynchronous": True}, asynchronous=True,
                                  skip_instance_cache=True)
    for p in range(spec["passes"]):
        c0 = time.process_time()
        t0 = time.perf_counter()
        arr = zarr.open_array(store=store, mode="r", zarr_format=2)
        data = arr[:]
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - c0
        raw = data.view(np.uint8)
        expect = np.fromfile(spec["local"], dtype=np.uint8, count=raw.size)
        ok = bool(np.array_equal(raw, expect))
        emit({"elapsed": elapsed, "bytes": int(raw.size), "items": int(arr.nchunks), "errors": 0,
              "cpu": cpu, "pass": p, "verified": "array matches the file" if ok else "MISMATCH",
              "verify_failed": not ok})
        del data, raw, expect


def child_ncdump(spec: dict[str, Any]) -> None:
    """``ncdump -v VAR`` of a zarr mount through NCZarr, its CDL text counted and dropped."""
    c0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(["ncdump", "-v", spec["var"], spec["url"]], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    assert proc.stdout is not None
    text = 0
    while chunk := proc.stdout.read(MiB):
        text += len(chunk)
    err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""
    rc = proc.wait()
    elapsed = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    emit({"elapsed": elapsed, "bytes": spec["bytes"], "items": spec["chunks"], "errors": int(rc != 0),
          "cpu": (c1.ru_utime + c1.ru_stime) - (c0.ru_utime + c0.ru_stime),
          "verified": f"ncdump exit {rc}, {text / 1e6:,.0f} MB of CDL" + (f": {err[:200]}" if rc else ""),
          "verify_failed": rc != 0})


def child_verify(spec: dict[str, Any]) -> None:
    """Compare random pieces of a file on the mount with the local file."""
    import random

    rnd = random.Random(7)
    size = spec["size"]
    bad = 0
    n = spec.get("n", 16)
    with open(spec["path"], "rb") as a, open(spec["local"], "rb") as b:
        for _ in range(n):
            off = rnd.randrange(0, max(size - 65536, 1))
            if os.pread(a.fileno(), 65536, off) != os.pread(b.fileno(), 65536, off):
                bad += 1
    emit({"verified": f"{n - bad}/{n} random 64 KiB pieces match", "verify_failed": bad > 0})


def _refs_fs(refs: str, **options: Any) -> Any:
    from fsspec.implementations.reference import ReferenceFileSystem

    return ReferenceFileSystem(fo=refs, **{"remote_protocol": "http", "skip_instance_cache": True, **options})


def child_fsspec_fuse(spec: dict[str, Any]) -> None:
    """fsspec's FUSE bridge (fusepy) over ReferenceFileSystem, in the foreground."""
    from fsspec.fuse import FUSEr, run

    class RootlessFUSEr(FUSEr):
        """FUSEr joins root + path; reference keys have no leading slash: root must be ''."""

        def __init__(self, fs: Any, path: str, ready_file: bool = False) -> None:
            super().__init__(fs, path, ready_file=ready_file)
            self.root = ""

    fs = _refs_fs(spec["refs"], **spec.get("fs", {}))
    run(fs, "", spec["mnt"], foreground=True, threads=spec.get("threads", False), ops_class=RootlessFUSEr)


CHILDREN: dict[str, Callable[[dict[str, Any]], None]] = {
    "files": child_files,
    "local": child_local,
    "inproc": child_inproc,
    "zarr": child_zarr,
    "ncdump": child_ncdump,
    "verify": child_verify,
    "fsspec_fuse": child_fsspec_fuse,
}


def main(argv: list[str]) -> int:
    kind, spec = argv
    if kind == "scale_inproc":  # the scale workload's in-process peer
        from bench.scale import child_inproc as scale_inproc

        CHILDREN[kind] = scale_inproc
    if kind.startswith("icechunk_"):  # the icechunk workload's readers
        from bench.icechunk import CHILDREN as icechunk_children

        CHILDREN.update(icechunk_children)
    if kind.startswith("native_"):  # the native workload's readers
        from bench.nativechunks import CHILDREN as native_children

        CHILDREN.update(native_children)
    try:
        CHILDREN[kind](json.loads(spec))
    except Exception as e:
        traceback.print_exc()
        emit({"fatal": f"{type(e).__name__}: {e}"[:500]})
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
