"""One configuration object, built from the command line / mount options.

Everything that tunes the daemon lives in :class:`MountConfig`; nothing is read from
module-level state. The object is serialised to JSON to hand it to the detached daemon
process over a pipe (never argv, so secrets in ``remote_options`` stay out of ``ps``).
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any


class ConfigError(ValueError):
    """A bad option value; the message is shown to the user as one line."""


def default_cache_dir() -> str:
    if os.geteuid() == 0:
        return "/var/cache/refmount"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "refmount")


@dataclass
class MountConfig:
    source: str = ""
    mountpoint: str = ""
    # fsspec: protocol for target URLs without one, and storage options for targets / SOURCE.
    remote_protocol: str | None = None
    remote_options: dict[str, Any] = field(default_factory=dict)
    target_options: dict[str, Any] = field(default_factory=dict)
    # FUSE / permissions
    allow_other: bool = False
    allow_root: bool = False
    uid: int = field(default_factory=os.getuid)
    gid: int = field(default_factory=os.getgid)
    umask: int = 0o222
    fsname: str | None = None
    subtype: str = "refmount"
    attr_timeout: float = 86400.0
    max_tasks: int = 256
    # caching
    cache_dir: str = field(default_factory=default_cache_dir)
    disk_cache: bool = True
    cache_size: int = 10 * 2**30
    max_readahead: int = 64 * 2**20
    read_ahead_kb: int = 1024  # kernel readahead for the mount's bdi (root only)
    memory_cache_size: int = 512 * 2**20
    whole_fetch_limit: int = 32 * 2**20
    block_size: int = 4 * 2**20
    page_push: bool = True  # store chunks already in memory in the kernel's page cache at open
    decode: bool = False  # serve zarr chunks decoded and metadata without codecs (decoded.py)
    # fetching
    timeout: float = 30.0
    retries: int = 3
    max_connections: int = 32
    merge_gap: int = 64 * 2**10  # concurrent reads of ranges this close share one request
    # process / logging
    foreground: bool = False
    debug: bool = False
    log: str | None = None  # "stderr" | "syslog" | path; None = stderr in foreground, syslog/file detached
    log_level: str = "info"
    bad_keys: str = "error"  # "error" | "skip"
    # Local targets are readable only under these directories ("/" = all). None = the
    # default: all when only the mounting user can access the mount (no escalation is
    # possible), and only the directory of a local SOURCE (nothing for a remote SOURCE)
    # when the mount is shared (allow_other / allow_root).
    allow_local: list[str] | None = None
    recover: bool = False  # clear a stale (dead-daemon) mount at MOUNTPOINT first
    # bounds on reading a reference set (refs/limits.py)
    max_inline: int = 64 * 2**20  # bytes of one inline value
    max_ratio: int = 200  # decompressed / compressed bytes of SOURCE; 0: no limit
    max_key_depth: int = 4095  # components of a key (directory inodes keep 12 bits of depth)
    max_key_length: int = 64 * 2**10  # bytes of a key
    max_nesting: int = 256  # nesting of JSON arrays and objects in SOURCE

    def local_roots(self) -> list[str]:
        if self.allow_local is not None:
            return self.allow_local
        if not (self.allow_other or self.allow_root):
            return ["/"]
        if "://" not in self.source and "::" not in self.source:
            real = os.path.realpath(self.source)  # a directory is a Parquet set: itself
            return [real if os.path.isdir(real) else os.path.dirname(real)]
        return []


def split_options(text: str) -> list[str]:
    """Split ``-o a,b=c,d={"x":1,"y":2}`` on commas outside JSON brackets and quotes."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    cur: list[str] = []
    escaped = False
    for ch in text:
        if quote:
            cur.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'" and depth:
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_size(text: str, name: str = "") -> int:
    """'512M', '10G', '4096', '1.5GiB' -> bytes (``name``: the option, for errors)."""
    what = f"{name}: " if name else ""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = 1
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30), ("T", 2**40)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        value = float(t)
    except ValueError:
        raise ConfigError(f"{what}not a size: {text!r} (use e.g. 4096, 64M, 10G)") from None
    if not math.isfinite(value):
        raise ConfigError(f"{what}not a size: {text!r} (use e.g. 4096, 64M, 10G)")
    if value < 0:
        raise ConfigError(f"{what}size must not be negative: {text!r}")
    return int(value * mult)


def _json_option(name: str, value: str) -> dict[str, Any]:
    if value.startswith("@"):
        try:
            with open(value[1:], encoding="utf-8") as f:
                value = f.read()
        except OSError as e:
            raise ConfigError(f"{name}: cannot read {value[1:]}: {e.strerror}") from None
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        # The value may hold credentials: never echo it.
        raise ConfigError(f"{name} is not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{name} must be a JSON object")
    return obj


def _int(name: str, value: str, base: int = 10, *, lo: int | None = None, hi: int | None = None) -> int:
    try:
        v = int(value, base)
    except ValueError:
        raise ConfigError(f"{name} must be an integer, got {value!r}") from None
    if (lo is not None and v < lo) or (hi is not None and v > hi):
        fmt = "{:o}" if base == 8 else "{}"
        raise ConfigError(f"{name} must be from {fmt.format(lo)} to {fmt.format(hi)}, got {value!r}")
    return v


def _float(name: str, value: str) -> float:
    try:
        v = float(value)
    except ValueError:
        raise ConfigError(f"{name} must be a number, got {value!r}") from None
    if not math.isfinite(v):  # trio's deadlines and the kernel's timeouts take finite numbers
        raise ConfigError(f"{name} must be a finite number of seconds, got {value!r}")
    if v <= 0:
        raise ConfigError(f"{name} must be positive, got {value!r}")
    return v


# Generic mount(8)/mount.fuse3 options that a filesystem helper must accept (and may ignore).
IGNORED_OPTIONS = frozenset(
    {"ro", "rw", "nodev", "nosuid", "noexec", "exec", "dev", "suid", "auto", "noauto",
     "_netdev", "nofail", "user", "users", "defaults", "noatime", "relatime", "atime",
     "default_permissions", "async", "sync"}
)

OPTION_HELP: dict[str, str] = {
    "remote_protocol=P": "protocol for target URLs that have none (e.g. s3, http)",
    "remote_options=JSON|@FILE": "fsspec storage options for the targets (credentials, endpoint, anon)",
    "target_options=JSON|@FILE": "fsspec storage options for opening SOURCE itself",
    "allow_other": "let other users access the mount (needs user_allow_other for non-root)",
    "allow_root": "let root access the mount",
    "uid=N, gid=N": "owner of all files (default: the mounting user)",
    "umask=OOO": "permission bits to remove (default 222: files 0444, dirs 0555)",
    "fsname=NAME, subtype=NAME": "names shown in /proc/mounts (default: SOURCE, refmount)",
    "cache_dir=DIR": "persistent cache (index and data blocks); default ~/.cache/refmount "
    "or /var/cache/refmount for root",
    "cache_size=SIZE": "bound of the disk block cache (default 10G); LRU eviction",
    "no_disk_cache": "keep nothing on disk (the index goes to a temporary file)",
    "max_readahead=SIZE": "largest readahead window, in a file and across keys read in target "
                          "order (default 64M; 0: off)",
    "read_ahead_kb=N": "kernel readahead of the mount, set when root (default 1024)",
    "memory_cache=SIZE": "bound of the in-memory block cache (default 512M)",
    "whole_fetch_limit=SIZE": "range references up to this size are fetched whole (default 32M)",
    "block_size=SIZE": "block size for larger ranges and whole-file targets (default 4M)",
    "no_page_push": "do not store chunks read ahead in the kernel's page cache when they are "
                    "opened (each then costs a READ round trip)",
    "decode": "serve every zarr chunk decoded (compressor and filters applied, little-endian) and "
              "each .zarray without codecs, so that readers without the codecs (ncdump, GDAL) read "
              "all arrays",
    "timeout=SEC": "time limit for one read's fetch, retries included (default 30)",
    "retries=N": "retries of a failed fetch, with backoff (default 3)",
    "max_connections=N": "concurrent requests to each target host (default 32)",
    "merge_gap=SIZE": "ranges of one target requested at once and at most this far apart are "
                      "fetched by one request of up to block_size (default 64K; 'off' to disable)",
    "attr_timeout=SEC": "how long the kernel may cache names and attributes (default 86400)",
    "max_tasks=N": "FUSE requests handled concurrently (default 256)",
    "log=stderr|syslog|FILE": "where the daemon logs (default: stderr with -f, else syslog, "
    "or a file in cache_dir when there is no syslog)",
    "log_level=LEVEL": "debug, info, warning or error (default info)",
    "allow_local=DIR[:DIR...]": "local files that references may read; default: all for a "
    "private mount, and for a shared one (allow_other/allow_root) only the directory of a local "
    "SOURCE (a Parquet directory itself; none for a remote SOURCE)",
    "recover": "if MOUNTPOINT is a stale mount left by a killed daemon, clear it first",
    "bad_keys=error|skip": "refuse a reference set with keys that cannot be paths (default), "
    "or skip those keys with a warning",
    "max_inline=SIZE": "largest inline value (also a Parquet 'raw' cell) (default 64M)",
    "max_ratio=N": "refuse a compressed SOURCE that expands more than N times (beyond its "
    "first 64M of output; default 200; 0: no limit)",
    "max_key_depth=N": "most '/'-separated components of a key (default and at most 4095)",
    "max_key_length=SIZE": "longest key, in bytes (default 64K)",
    "max_nesting=N": "deepest nesting of JSON arrays and objects in SOURCE (default 256)",
}


def apply_options(cfg: MountConfig, options: list[str]) -> None:
    """Apply ``-o`` options (already split) to ``cfg``; raises ConfigError on bad ones."""
    for opt in options:
        name, sep, value = opt.partition("=")
        name = name.strip()
        if name in IGNORED_OPTIONS or name == "comment" or name.startswith(("x-systemd.", "x-")):
            continue
        flag_only = {"allow_other", "allow_root", "no_disk_cache", "no_page_push", "debug", "recover",
                     "decode"}
        if name in flag_only:
            if sep:
                raise ConfigError(f"option {name} takes no value")
        elif not sep:
            raise ConfigError(f"option {name!r} needs a value ({name}=...)")
        match name:
            case "remote_protocol":
                cfg.remote_protocol = value or None
            case "remote_options":
                cfg.remote_options = _json_option(name, value)
            case "target_options":
                cfg.target_options = _json_option(name, value)
            case "allow_other":
                cfg.allow_other = True
            case "allow_root":
                cfg.allow_root = True
            case "uid":
                cfg.uid = _int(name, value, lo=0, hi=2**32 - 2)
            case "gid":
                cfg.gid = _int(name, value, lo=0, hi=2**32 - 2)
            case "umask":
                cfg.umask = _int(name, value, 8, lo=0, hi=0o777)
            case "fsname":
                cfg.fsname = value
            case "subtype":
                cfg.subtype = value
            case "cache_dir":
                cfg.cache_dir = os.path.abspath(value)
            case "no_disk_cache":
                cfg.disk_cache = False
            case "no_page_push":
                cfg.page_push = False
            case "decode":
                cfg.decode = True
            case "cache_size":
                cfg.cache_size = parse_size(value, name)
            case "max_readahead":
                cfg.max_readahead = parse_size(value, name)
            case "read_ahead_kb":
                cfg.read_ahead_kb = max(_int(name, value), 0)
            case "memory_cache":
                cfg.memory_cache_size = parse_size(value, name)
            case "whole_fetch_limit":
                cfg.whole_fetch_limit = parse_size(value, name)
            case "block_size":
                cfg.block_size = max(parse_size(value, name), 4096)
            case "timeout":
                cfg.timeout = _float(name, value)
            case "retries":
                cfg.retries = max(_int(name, value), 0)
            case "max_connections":
                cfg.max_connections = max(_int(name, value), 1)
            case "merge_gap":
                cfg.merge_gap = -1 if value in ("off", "-1") else parse_size(value, name)
            case "attr_timeout":
                cfg.attr_timeout = _float(name, value)
            case "max_tasks":
                cfg.max_tasks = max(_int(name, value), 1)
            case "log":
                # The daemon changes to / before it opens the log: a relative path is
                # taken relative to where refmount was started.
                cfg.log = value if value in ("stderr", "syslog") else os.path.abspath(value)
            case "log_level":
                if value.lower() not in ("debug", "info", "warning", "error"):
                    raise ConfigError(f"log_level must be debug, info, warning or error: {value!r}")
                cfg.log_level = value.lower()
            case "bad_keys":
                if value not in ("error", "skip"):
                    raise ConfigError(f"bad_keys must be 'error' or 'skip', got {value!r}")
                cfg.bad_keys = value
            case "allow_local":
                roots = [r for r in value.split(":") if r]
                if not all(os.path.isabs(r) for r in roots):
                    raise ConfigError("allow_local takes absolute directories separated by ':'")
                cfg.allow_local = [os.path.realpath(r) for r in roots]
            case "recover":
                cfg.recover = True
            case "max_inline":
                cfg.max_inline = parse_size(value, name)
            case "max_ratio":
                cfg.max_ratio = _int(name, value, lo=0, hi=2**62)
            case "max_key_depth":
                cfg.max_key_depth = _int(name, value, lo=1, hi=4095)
            case "max_key_length":
                cfg.max_key_length = max(parse_size(value, name), 1)
            case "max_nesting":
                cfg.max_nesting = _int(name, value, lo=2, hi=512)
            case "debug":
                cfg.debug = True
                cfg.log_level = "debug"
            case _:
                raise ConfigError(f"unknown option {name!r} (see refmount --help)")
