#!/usr/bin/env bash
# Install refmount for system use, from this checkout (idempotent; run as root):
#   - Debian packages it needs to build and run (FUSE 3, python3-venv, pyfuse3's build deps);
#   - its own virtualenv /opt/refmount/venv with a regular (not editable) install of this
#     checkout, made with the system's /usr/bin/python3;
#   - /usr/local/bin/refmount, a symlink to the venv's script: the PATH that mount(8),
#     mount.fuse3, /etc/fstab and systemd use;
#   - /etc/systemd/system/refmount@.service and refmount-serve@.service (systemctl
#     daemon-reload when systemd runs);
#   - /etc/refmount/ (mode 0700) with refmount.conf.example and refmount-serve.conf.example
#     (0600): an instance's configuration, which may hold credentials: copy one to
#     /etc/refmount/<instance>.conf (a mount) or /etc/refmount/serve-<instance>.conf.
# A second run with an unchanged checkout changes nothing; a changed checkout is reinstalled.
#
# Usage: sudo bash scripts/install.sh [--python PATH] [--extra NAME]... [--uninstall]
#   --python PATH  the interpreter of the virtualenv (default /usr/bin/python3, else python3)
#   --extra NAME   also install an optional dependency group of refmount, e.g. --extra s3
#   --uninstall    remove all of the above (not /etc/refmount/*.conf, not the cache in
#                  /var/cache/refmount, not the Debian packages); refuses while the
#                  installed refmount serves a mount
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
REPO=$PWD

PREFIX=/opt/refmount
VENV=$PREFIX/venv
STAMP=$VENV/.refmount-install-stamp
BIN=/usr/local/bin/refmount
UNIT_DIR=/etc/systemd/system
UNIT=$UNIT_DIR/refmount@.service
SERVE_UNIT=$UNIT_DIR/refmount-serve@.service
CONF_DIR=/etc/refmount
CONF_EXAMPLE=$CONF_DIR/refmount.conf.example
SERVE_CONF_EXAMPLE=$CONF_DIR/refmount-serve.conf.example

say() { printf 'install: %s\n' "$*"; }
die() {
    printf 'install: error: %s\n' "$*" >&2
    exit 1
}

UNINSTALL=0
PYTHON=""
EXTRAS=()
while [ $# -gt 0 ]; do
    case "$1" in
        --uninstall) UNINSTALL=1 ;;
        --python)
            [ $# -ge 2 ] || die "--python needs a path"
            PYTHON=$2
            shift
            ;;
        --extra)
            [ $# -ge 2 ] || die "--extra needs a name"
            EXTRAS+=("$2")
            shift
            ;;
        -h | --help)
            sed -n '2,21p' "$0"
            exit 0
            ;;
        *) die "unknown argument: $1 (see --help)" ;;
    esac
    shift
done

[ "$(id -u)" -eq 0 ] || die "run as root (sudo bash scripts/install.sh): it writes $PREFIX, $BIN and /etc"

reload_systemd() {
    if [ -d /run/systemd/system ] && command -v systemctl >/dev/null; then
        systemctl daemon-reload
        say "systemctl daemon-reload"
    fi
}

# --- uninstall -----------------------------------------------------------------------------------

if [ "$UNINSTALL" -eq 1 ]; then
    # Processes running the installed refmount (daemons serving mounts, services) would lose
    # their files: refuse, naming them.
    busy=()
    for d in /proc/[0-9]*; do
        cmd=$( { tr '\0' ' ' <"$d/cmdline"; } 2>/dev/null) || continue
        case "$cmd" in
            "$VENV/bin/"*) busy+=("${d#/proc/}: ${cmd% }") ;;
        esac
    done
    if [ "${#busy[@]}" -gt 0 ]; then
        die "the installed refmount is running; unmount its file systems first (fusermount3 -u MNT, or systemctl stop refmount@...): $(printf '[%s] ' "${busy[@]}")"
    fi
    removed=0
    if [ -L "$BIN" ] && [ "$(readlink "$BIN")" = "$VENV/bin/refmount" ]; then
        rm -f "$BIN"
        say "removed $BIN"
        removed=1
    elif [ -e "$BIN" ] || [ -L "$BIN" ]; then
        say "left $BIN alone: it is not the symlink this script makes"
    fi
    units=0
    for f in "$UNIT" "$SERVE_UNIT"; do
        if [ -f "$f" ]; then
            rm -f "$f"
            say "removed $f"
            removed=1
            units=1
        fi
    done
    if [ "$units" -eq 1 ]; then reload_systemd; fi
    for f in "$CONF_EXAMPLE" "$SERVE_CONF_EXAMPLE"; do
        if [ -f "$f" ]; then
            rm -f "$f"
            say "removed $f"
            removed=1
        fi
    done
    if [ -d "$CONF_DIR" ]; then
        if rmdir "$CONF_DIR" 2>/dev/null; then
            say "removed $CONF_DIR"
        else
            say "kept $CONF_DIR: it holds configuration files ($(ls "$CONF_DIR" | tr '\n' ' '))"
        fi
    fi
    if [ -d "$PREFIX" ]; then
        rm -rf "$PREFIX"
        say "removed $PREFIX"
        removed=1
    fi
    if [ "$removed" -eq 0 ]; then
        say "nothing to remove"
    fi
    if [ -d /var/cache/refmount ]; then
        say "kept the cache /var/cache/refmount (remove it by hand if it is no longer wanted)"
    fi
    exit 0
fi

# --- install -------------------------------------------------------------------------------------

# shellcheck source=lib/apt.sh
. scripts/lib/apt.sh
# fuse3: fusermount3 and mount.fuse3; libfuse3-dev, pkg-config, gcc, python3-dev: pyfuse3 is
# built from source against libfuse3; python3, python3-venv: the virtualenv.
apt_ensure fuse3 libfuse3-dev pkg-config gcc python3 python3-dev python3-venv

if [ -z "$PYTHON" ]; then
    if [ -x /usr/bin/python3 ]; then PYTHON=/usr/bin/python3; else PYTHON=$(command -v python3); fi
fi
[ -x "$PYTHON" ] || die "no python3 at $PYTHON"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' ||
    die "$PYTHON is $("$PYTHON" --version 2>&1); refmount needs Python 3.11 or later (--python PATH)"
PYTHON=$("$PYTHON" -c 'import os, sys; print(os.path.realpath(sys.executable))')

# What is installed is identified by the interpreter, the extras and the content of every file
# that goes into the package.
files=(pyproject.toml README.md)
while IFS= read -r f; do files+=("$f"); done < <(find refmount -name '*.py' | LC_ALL=C sort)
extras=$(IFS=,; echo "${EXTRAS[*]:-}")
want="$(cat "${files[@]}" | sha256sum | cut -d' ' -f1) $PYTHON [$extras]"
have=""
[ -f "$STAMP" ] && have=$(cat "$STAMP")

if [ "$want" = "$have" ] && "$VENV/bin/refmount" --version >/dev/null 2>&1; then
    say "$VENV up to date ($("$VENV/bin/refmount" --version))"
else
    if [ -x "$VENV/bin/python" ] &&
        [ "$("$VENV/bin/python" -c 'import os, sys; print(os.path.realpath(sys.executable))')" != "$PYTHON" ]; then
        say "$VENV was made with another python: recreating it"
        rm -rf "$VENV"
    fi
    if [ ! -x "$VENV/bin/python" ]; then
        say "creating $VENV with $PYTHON ($("$PYTHON" --version 2>&1))"
        mkdir -p "$PREFIX"
        "$PYTHON" -m venv "$VENV"
    fi
    # Build from a copy of the package's files, so that the checkout gets no build/ or
    # *.egg-info of a non-editable install, and uncommitted changes are what gets installed.
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    mkdir -p "$work/src"
    cp --parents "${files[@]}" "$work/src/"
    say "building refmount from $REPO"
    "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check --no-deps -w "$work/dist" "$work/src"
    wheel=$(ls "$work"/dist/refmount-*.whl)
    spec=$wheel
    if [ -n "$extras" ]; then spec="refmount[$extras] @ file://$wheel"; fi
    say "pip install $(basename "$wheel")${extras:+ [$extras]} into $VENV"
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check "$spec"
    # the same version may be installed already: put this build's files in place
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --force-reinstall --no-deps "$wheel"
    printf '%s\n' "$want" >"$STAMP"
    say "installed $("$VENV/bin/refmount" --version)"
fi

if [ -L "$BIN" ] && [ "$(readlink "$BIN")" = "$VENV/bin/refmount" ]; then
    say "$BIN present"
else
    if [ -e "$BIN" ] && [ ! -L "$BIN" ]; then
        die "$BIN exists and is not a symlink; move it away and run again"
    fi
    ln -sfn "$VENV/bin/refmount" "$BIN"
    say "linked $BIN -> $VENV/bin/refmount"
fi

install_file() { # SRC DEST [MODE]: copy when missing or different (mode 0644 by default)
    local mode=${3:-0644}
    if [ -f "$2" ] && cmp -s "$1" "$2"; then
        chmod "$mode" "$2"
        say "$2 present"
        return 1
    fi
    install -D -m "$mode" "$1" "$2"
    say "installed $2"
}

units=0
install_file systemd/refmount@.service "$UNIT" && units=1
install_file systemd/refmount-serve@.service "$SERVE_UNIT" && units=1
if [ "$units" -eq 1 ]; then reload_systemd; fi
# An instance's configuration may hold credentials (remote_options): the directory is root's
# alone and the example, the file that gets copied, is 0600 (cp keeps its mode).
install -d -m 0700 "$CONF_DIR"
install_file systemd/refmount.conf.example "$CONF_EXAMPLE" 0600 || true
install_file systemd/refmount-serve.conf.example "$SERVE_CONF_EXAMPLE" 0600 || true

say "done: $(command -v refmount 2>/dev/null || echo "$BIN") -> $("$BIN" --version)"
