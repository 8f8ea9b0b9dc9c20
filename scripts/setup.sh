#!/usr/bin/env bash
# Idempotent set-up of a fresh Debian 12 machine for refmount:
#   - system packages (FUSE 3, build deps for pyfuse3, the clients the tests read with) via apt,
#     only when some are missing;
#   - a virtualenv at .venv;
#   - `pip install -e '.[test]'`, skipped when pyproject.toml is unchanged since the last run;
#   - pyfuse3 rebuilt from its sdist with patches/pyfuse3-noopen.patch (skipped when built).
#
# Usage: scripts/setup.sh [--demo | --bench]
#   --demo   only what scripts/demo.sh uses: FUSE 3, ncdump and '.[demo]' (netCDF4, h5py,
#            kerchunk, xarray); none of the test suite's clients (GDAL, CDO, NCO, Chromium)
#   --bench  also install what the benchmarks (bench/, python -m bench) need: their fsspec FUSE
#            peer (Debian libfuse2 + PyPI fusepy, used by fsspec.fuse), the load generators of
#            the serve workload (wrk, ab) and its Python peers ('.[bench]': xpublish, hypercorn).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."

BENCH=0
PROFILE=test
for arg in "$@"; do
    case "$arg" in
        --bench) BENCH=1 ;;
        --demo) PROFILE=demo ;;
        -h | --help)
            sed -n '2,13p' "$0"
            exit 0
            ;;
        *)
            echo "setup: unknown argument: $arg" >&2
            exit 2
            ;;
    esac
done

say() { printf 'setup: %s\n' "$*"; }

# shellcheck source=lib/apt.sh
. scripts/lib/apt.sh

if [ "$BENCH" -eq 1 ] && [ "$PROFILE" = demo ]; then
    echo "setup: --demo and --bench exclude each other" >&2
    exit 2
fi

# fuse3/libfuse3-dev/pkg-config/gcc/python3-dev: pyfuse3 is an sdist built against libfuse3;
# patch: applies patches/pyfuse3-noopen.patch to it.
# python3-venv: `python3 -m venv` on Debian's python3.
# netcdf-bin (ncdump): the demo's netCDF-C client.
PKGS=(fuse3 libfuse3-dev pkg-config gcc python3-dev python3-venv netcdf-bin patch)
if [ "$PROFILE" = test ]; then
    # nginx-light (HTTP range server), attr, curl, psmisc: tests;
    # systemd: systemd-analyze verify of the unit files in tests;
    # gdal-bin (gdalinfo, gdal_translate): a non-Python client of -o decode in tests;
    # cdo, nco (ncks): netCDF-C clients that compute statistics through -o decode in tests;
    # chromium: a real browser for the HTTP front end's CORS tests (headless);
    # python3-seccomp: tests run the unit's commands under its SystemCallFilter= (no systemd here);
    # flatbuffers-compiler (flatc): scripts/gen_icechunk_flatbuffers.sh, checked by the unit tests;
    # prometheus (prometheus, promtool): scrapes a mount and a server in tests, checks expositions;
    # rclone: an S3 client (ListObjects V1) of serve's S3 dialect in tests.
    PKGS+=(nginx-light attr curl psmisc systemd gdal-bin cdo nco chromium python3-seccomp
           flatbuffers-compiler prometheus rclone)
fi
if [ "$BENCH" -eq 1 ]; then
    # wrk (GET) and apache2-utils' ab (HEAD: wrk waits for a HEAD answer's body): the serve workload
    PKGS+=(libfuse2 wrk apache2-utils)
fi

apt_ensure "${PKGS[@]}"

if [ ! -x .venv/bin/python ]; then
    say "creating .venv with $(command -v python3) ($(python3 --version 2>&1))"
    python3 -m venv .venv
else
    say ".venv present ($(.venv/bin/python --version 2>&1))"
fi

# The stamp holds pyproject.toml's hash and the extra installed: '.[test]' includes '.[demo]',
# so a test set-up serves the demo too, and a demo set-up is completed by the first test run.
STAMP=.venv/.refmount-setup-stamp
hash="$(sha256sum pyproject.toml | cut -d' ' -f1)"
have=""
if [ -f "$STAMP" ]; then
    have="$(cat "$STAMP")"
fi
current=no
case "$have" in
    "$hash test") current=yes ;;
    "$hash demo") [ "$PROFILE" = demo ] && current=yes ;;
esac
# (the installed distribution is checked, not `import refmount`: that also reads the tree)
if [ "$current" = yes ] && [ -x .venv/bin/refmount ] &&
    .venv/bin/python -c 'import importlib.metadata as m; m.distribution("refmount")' 2>/dev/null; then
    say "python packages up to date (pyproject.toml unchanged)"
else
    say "pip install -e '.[$PROFILE]'"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e ".[$PROFILE]"
    printf '%s\n' "$hash $PROFILE" >"$STAMP"
fi

# pyfuse3 built from its sdist with patches/pyfuse3-noopen.patch (read() gets the inode when the
# file handle is 0: what the daemon's no_open needs, fuse/noopen.py). Pinned: the patch is made
# for this version, which pyproject.toml pins too. The stamp holds the version and the patch's
# hash, so a changed patch is built again; a pyfuse3 without the patch's marker is replaced.
PYFUSE3_VERSION=3.5.0
PYFUSE3_PATCH=patches/pyfuse3-noopen.patch
PYFUSE3_STAMP=.venv/.refmount-pyfuse3-stamp
pyfuse3_want="$PYFUSE3_VERSION $(sha256sum "$PYFUSE3_PATCH" | cut -d' ' -f1)"
if [ -f "$PYFUSE3_STAMP" ] && [ "$(cat "$PYFUSE3_STAMP")" = "$pyfuse3_want" ] &&
    .venv/bin/python -c 'import pyfuse3, sys; sys.exit(not getattr(pyfuse3, "REFMOUNT_READ_INODE", False))' \
        2>/dev/null; then
    say "pyfuse3 $PYFUSE3_VERSION with $PYFUSE3_PATCH present"
else
    say "building pyfuse3 $PYFUSE3_VERSION with $PYFUSE3_PATCH"
    build="$(mktemp -d)"
    trap 'rm -rf "$build"' EXIT
    .venv/bin/python -m pip download -q --disable-pip-version-check --no-deps --no-binary pyfuse3 \
        -d "$build" "pyfuse3==$PYFUSE3_VERSION"
    tar -xzf "$build/pyfuse3-$PYFUSE3_VERSION.tar.gz" -C "$build"
    patch -s -p1 -d "$build/pyfuse3-$PYFUSE3_VERSION" <"$PYFUSE3_PATCH"
    # Cython (a build requirement) compiles the patched .pyx, not the sdist's generated C
    rm -f "$build/pyfuse3-$PYFUSE3_VERSION/src/pyfuse3/__init__.c"
    .venv/bin/python -m pip install -q --disable-pip-version-check --no-deps --force-reinstall \
        --no-cache-dir "$build/pyfuse3-$PYFUSE3_VERSION"
    .venv/bin/python -c 'import pyfuse3; assert pyfuse3.REFMOUNT_READ_INODE'
    printf '%s\n' "$pyfuse3_want" >"$PYFUSE3_STAMP"
    rm -rf "$build"
    trap - EXIT
fi

if [ "$BENCH" -eq 1 ]; then
    if .venv/bin/python -c 'import fuse' 2>/dev/null; then
        say "fusepy present"
    else
        say "pip install fusepy (fsspec FUSE peer for the benchmark)"
        .venv/bin/python -m pip install -q --disable-pip-version-check fusepy
    fi
    say "pip install -e '.[bench]' (the serve workload's Python peers)"
    .venv/bin/python -m pip install -q --disable-pip-version-check -e '.[bench]'
fi

# Byte-compile the checkout: every mount starts two fresh interpreters (the CLI and the daemon),
# and with PYTHONDONTWRITEBYTECODE set each of them would compile refmount's ~100 modules again.
.venv/bin/python -m compileall -q -x '/(\.venv|build|dist)/' refmount tests bench >/dev/null

say "done"
