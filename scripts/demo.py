#!/usr/bin/env python3
"""refmount demo: build a small real netCDF4 dataset, reference it with kerchunk, mount the
references with the refmount CLI, and read the mount with ls, cat, xarray and ncdump (also
through `-o decode`, which serves compressed chunks decoded).

Run through scripts/demo.sh (which sets the machine up first). Re-runnable: everything lives in
./demo-work/ and is rebuilt on each run; the mount is always unmounted at the end. Exits non-zero
when any check fails.
"""

from __future__ import annotations

import base64
import contextlib
import json
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
WORK = REPO / "demo-work"
NC = WORK / "climate.nc"
REFS = WORK / "refs.json"
MNT = WORK / "mnt"
MNT_DECODED = WORK / "mnt-decoded"
LOG = WORK / "refmount.log"

# the uncompressed, contiguous, little-endian variable that ncdump -v reads through a plain
# mount (Debian's netcdf-c 4.9.0 has no zlib filter plugin for NCZarr)
PLAIN_VAR = "elevation"
# a zlib-compressed variable, which ncdump -v reads through a mount with -o decode
COMPRESSED_VAR = "temperature"


def banner(text: str) -> None:
    print(f"\n=== {text} ===", flush=True)


def show_cmd(cmd: list[str]) -> None:
    shown = [str(Path(c).relative_to(REPO)) if c.startswith(str(REPO)) else c for c in cmd]
    print("$ " + shlex.join(shown), flush=True)


def run(cmd: list[str], *, check: bool = True, quiet: bool = False) -> subprocess.CompletedProcess:
    show_cmd(cmd)
    r = subprocess.run(cmd, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if not quiet:
        sys.stdout.write(r.stdout)
    if r.stderr:
        sys.stdout.write(r.stderr)
    if check and r.returncode != 0:
        raise CheckFailed(f"{shlex.join(cmd)} exited {r.returncode}")
    return r


class CheckFailed(Exception):
    pass


# --------------------------------------------------------------------------------------------
# Data
# --------------------------------------------------------------------------------------------


def build_dataset(path: Path) -> None:
    """A small CF-style netCDF4 file with chunked+compressed and plain variables."""
    import netCDF4

    rng = np.random.default_rng(42)
    nt, ny, nx = 8, 18, 36
    tmp = path.with_suffix(".nc.tmp")
    with netCDF4.Dataset(tmp, "w", format="NETCDF4") as ds:
        ds.title = "refmount demo: synthetic monthly climate"
        ds.Conventions = "CF-1.8"
        ds.createDimension("time", nt)
        ds.createDimension("lat", ny)
        ds.createDimension("lon", nx)

        t = ds.createVariable("time", "f8", ("time",))
        t.units = "days since 2000-01-01 00:00:00"
        t.calendar = "standard"
        t.standard_name = "time"
        t[:] = np.arange(nt) * 30.0

        lat = ds.createVariable("lat", "f4", ("lat",))
        lat.units = "degrees_north"
        lat.standard_name = "latitude"
        lat[:] = np.linspace(-85, 85, ny, dtype="f4")

        lon = ds.createVariable("lon", "f4", ("lon",))
        lon.units = "degrees_east"
        lon.standard_name = "longitude"
        lon[:] = np.linspace(0, 350, nx, dtype="f4")

        la, lo = np.meshgrid(lat[:], lon[:], indexing="ij")
        base = 288.0 - 40.0 * np.sin(np.deg2rad(la)) ** 2 + 3.0 * np.cos(np.deg2rad(lo))
        season = 8.0 * np.sin(2 * np.pi * np.arange(nt) / 12.0)[:, None, None]
        temp = base[None] + season + rng.normal(0, 0.5, (nt, ny, nx))

        tv = ds.createVariable(
            "temperature", "f4", ("time", "lat", "lon"),
            zlib=True, complevel=4, chunksizes=(2, 9, 18), fill_value=np.float32(-9999.0),
        )  # fmt: skip
        tv.units = "K"
        tv.standard_name = "air_temperature"
        tv[:] = temp.astype("f4")

        pv = ds.createVariable(
            "precipitation", "f4", ("time", "lat", "lon"),
            zlib=True, shuffle=True, complevel=5, chunksizes=(4, 18, 18),
        )  # fmt: skip
        pv.units = "mm/day"
        pv.standard_name = "precipitation_flux"
        pv[:] = rng.gamma(0.8, 3.0, (nt, ny, nx)).astype("f4")

        ev = ds.createVariable(PLAIN_VAR, "<i4", ("lat", "lon"), endian="little")
        ev.units = "m"
        ev.long_name = "surface elevation (uncompressed, contiguous, little-endian)"
        ev[:] = (rng.random((ny, nx)) * 4000).astype("<i4")
    tmp.replace(path)


def make_refs(nc: Path, out: Path) -> dict:
    """Version 0 references for nc (kerchunk's translate() wraps them as {"version": 1,
    "refs": {...}} with no templates or gen; its "refs" object is the Version 0 set)."""
    from kerchunk.hdf import SingleHdf5ToZarr

    translated = SingleHdf5ToZarr(str(nc), inline_threshold=100).translate()
    refs = translated.get("refs", translated)
    tmp = out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(refs, indent=1, sort_keys=True))
    tmp.replace(out)
    return refs


def expected_bytes(value) -> bytes:
    if isinstance(value, str):
        return base64.b64decode(value[7:]) if value.startswith("base64:") else value.encode()
    if isinstance(value, dict):
        return json.dumps(value).encode()
    url = value[0].removeprefix("file://")
    with open(url, "rb") as f:
        if len(value) == 1:
            return f.read()
        f.seek(value[1])
        return f.read(value[2])


# --------------------------------------------------------------------------------------------
# Mount helpers
# --------------------------------------------------------------------------------------------


def is_mounted(mnt: Path) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == str(mnt) for line in f if len(line.split()) > 1)


def refmount_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "refmount"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "refmount"]


def unmount(mnt: Path) -> None:
    for _ in range(20):
        if not is_mounted(mnt):
            return
        r = subprocess.run(["fusermount3", "-u", str(mnt)], capture_output=True, text=True)
        if r.returncode == 0:
            print(f"$ fusermount3 -u {mnt.relative_to(REPO)}")
            return
        time.sleep(0.25)
    print(f"fusermount3 -u failed ({r.stderr.strip()}); lazy unmount")
    subprocess.run(["fusermount3", "-u", "-z", str(mnt)], capture_output=True)


def parse_cdl_values(cdl: str, var: str) -> np.ndarray:
    m = re.search(rf"^\s*{re.escape(var)} =\s*(.*?);", cdl, re.S | re.M)
    if not m:
        raise CheckFailed(f"no data section for {var} in ncdump output")
    return np.array([float(v) for v in m.group(1).replace("\n", " ").split(",")])


# --------------------------------------------------------------------------------------------
# Demo
# --------------------------------------------------------------------------------------------


def main() -> int:
    import xarray as xr

    results: list[tuple[str, bool, str]] = []

    def check(name: str, fn) -> None:
        try:
            detail = fn() or ""
            results.append((name, True, detail))
            print(f"[ok] {name}{': ' + detail if detail else ''}", flush=True)
        except Exception as e:  # every failed check is reported, the demo goes on
            results.append((name, False, f"{type(e).__name__}: {e}"))
            print(f"[FAIL] {name}: {type(e).__name__}: {e}", flush=True)

    WORK.mkdir(exist_ok=True)
    if is_mounted(MNT):
        print(f"(left-over mount at {MNT} from an earlier run: unmounting)")
        unmount(MNT)
    if is_mounted(MNT_DECODED):
        unmount(MNT_DECODED)
    MNT.mkdir(exist_ok=True)

    banner("1. a small real dataset (netCDF4/HDF5) and its kerchunk references")
    build_dataset(NC)
    refs = make_refs(NC, REFS)
    n_inline = sum(isinstance(v, str) for v in refs.values())
    print(f"{NC.relative_to(REPO)}: {NC.stat().st_size} bytes")
    print(
        f"{REFS.relative_to(REPO)}: {len(refs)} keys "
        f"({n_inline} inline, {len(refs) - n_inline} byte-range references)"
    )
    with xr.open_dataset(NC) as original:
        original.load()

    LOG.unlink(missing_ok=True)
    try:
        banner("2. mount (daemon mode: returns once the mount answers)")

        def do_mount() -> str:
            t0 = time.monotonic()
            run([*refmount_cmd(), str(REFS), str(MNT), "-o", f"log={LOG}"])
            dt = time.monotonic() - t0
            if not is_mounted(MNT):
                raise CheckFailed("refmount exited 0 but nothing is mounted")
            (MNT / ".zgroup").stat()
            return f"answered after {dt:.2f} s"

        check("refmount mounts and returns", do_mount)
        if not is_mounted(MNT):
            raise CheckFailed("not mounted: skipping the reads")

        banner("3. ls -la and cat .zgroup")

        def do_ls() -> str:
            run(["ls", "-la", str(MNT)])
            run(["ls", "-la", str(MNT / "temperature")])
            want = sorted({k.split("/")[0] for k in refs})
            got = sorted(p.name for p in MNT.iterdir())
            if got != want:
                raise CheckFailed(f"top level {got} != {want}")
            return f"{len(got)} entries at the top"

        check("ls -la lists the top-level keys", do_ls)

        def do_cat() -> str:
            r = run(["cat", str(MNT / ".zgroup")])
            print()
            if r.stdout.encode() != expected_bytes(refs[".zgroup"]):
                raise CheckFailed(".zgroup content differs from the reference")
            return ""

        check("cat .zgroup", do_cat)

        def do_bytes() -> str:
            for key, value in refs.items():
                data = (MNT / key).read_bytes()
                if data != expected_bytes(value):
                    raise CheckFailed(f"{key}: {len(data)} bytes differ from the reference")
                if (MNT / key).stat().st_size != len(data):
                    raise CheckFailed(f"{key}: st_size != length")
            return f"all {len(refs)} files"

        check("every file's bytes and st_size equal the referenced bytes", do_bytes)

        banner("4. xarray.open_zarr on the mount")

        def do_xarray() -> str:
            print(f">>> xr.open_zarr({str(MNT.relative_to(REPO))!r}, consolidated=False)")
            with xr.open_zarr(MNT, consolidated=False) as ds:
                print(ds)
                ds.load()
                xr.testing.assert_equal(ds, original)
                for name in original.variables:
                    a, b = original[name].attrs, ds[name].attrs
                    if a != b:
                        raise CheckFailed(f"attrs of {name} differ: {a} != {b}")
                mean = float(ds.temperature.mean())
            return f"mean temperature {mean:.2f} K"

        check("xarray.open_zarr(mnt) equals xarray.open_dataset(original)", do_xarray)

        banner("5. ncdump through NCZarr")
        url = f"file://{MNT}#mode=zarr,file"

        def do_ncdump_h() -> str:
            r = run(["ncdump", "-h", url])
            for needle in ("temperature(time, lat, lon)", "precipitation(time, lat, lon)",
                           f"{PLAIN_VAR}(lat, lon)"):  # fmt: skip
                if needle not in r.stdout:
                    raise CheckFailed(f"{needle!r} not in the ncdump -h output")
            return ""

        check("ncdump -h", do_ncdump_h)

        def do_ncdump_v() -> str:
            r = run(["ncdump", "-v", PLAIN_VAR, url], quiet=True)
            lines = r.stdout.splitlines()
            start = next(i for i, line in enumerate(lines) if line.startswith("data:"))
            print("\n".join([*lines[start : start + 6], "  ...", *lines[-3:]]))
            got = parse_cdl_values(r.stdout, PLAIN_VAR)
            want = original[PLAIN_VAR].values.ravel()
            if got.shape != want.shape or not np.array_equal(got, want):
                raise CheckFailed(f"{PLAIN_VAR} values from ncdump differ from the original")
            return f"{got.size} values of {PLAIN_VAR} equal the original"

        check(f"ncdump -v {PLAIN_VAR}", do_ncdump_v)

        banner(f"6. -o decode: chunks served decoded, so ncdump reads {COMPRESSED_VAR} too")
        MNT_DECODED.mkdir(exist_ok=True)
        url_decoded = f"file://{MNT_DECODED}#mode=zarr,file"

        def do_ncdump_decoded() -> str:
            run([*refmount_cmd(), str(REFS), str(MNT_DECODED), "-o", f"decode,log={LOG}"])
            zarray = json.loads((MNT_DECODED / COMPRESSED_VAR / ".zarray").read_text())
            print(f"{COMPRESSED_VAR}/.zarray as served: compressor={zarray['compressor']}, "
                  f"filters={zarray['filters']}, dtype={zarray['dtype']}")
            r = run(["ncdump", "-v", COMPRESSED_VAR, url_decoded], quiet=True)
            lines = r.stdout.splitlines()
            start = next(i for i, line in enumerate(lines) if line.startswith("data:"))
            print("\n".join([*lines[start : start + 6], "  ..."]))
            got = parse_cdl_values(r.stdout, COMPRESSED_VAR)
            want = original[COMPRESSED_VAR].values.ravel()
            # ncdump prints float32 with 7 significant digits
            if got.shape != want.shape or not np.allclose(got, want, rtol=1e-6, atol=0):
                raise CheckFailed(f"{COMPRESSED_VAR} values from ncdump differ from the original")
            return f"{got.size} values of the zlib-compressed {COMPRESSED_VAR} equal the original"

        check(f"ncdump -v {COMPRESSED_VAR} through -o decode", do_ncdump_decoded)
    except CheckFailed as e:
        print(f"[FAIL] {e}")
        results.append(("mount", False, str(e)))
    finally:
        banner("7. unmount")
        for mnt in (MNT, MNT_DECODED):
            with contextlib.suppress(Exception):
                unmount(mnt)
            if is_mounted(mnt):
                results.append(("unmount", False, f"{mnt} is still mounted"))

    failed = [r for r in results if not r[1]]
    banner(f"summary: {len(results) - len(failed)} passed, {len(failed)} failed")
    for name, ok, detail in results:
        print(f"  {'ok  ' if ok else 'FAIL'}  {name}{'' if ok else ': ' + detail}")
    if failed and LOG.exists():
        print(f"\nrefmount log ({LOG.relative_to(REPO)}), last lines:")
        print("\n".join(LOG.read_text(errors="replace").splitlines()[-20:]))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
