"""The option table: every ``-o`` option declared once (name, kind of value, default, help), and
what is made from it — :class:`MountConfig`, the parsing of ``-o`` (:func:`apply_options`),
``refmount --help`` and the table of ``docs/configuration.md``."""

from __future__ import annotations

import dataclasses
import difflib
import os
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from refmount.base.errors import ConfigError
from refmount.base.urls import is_local, local_path
from refmount.config.values import (
    DECODE_MAX_CHUNK_BYTES,
    Choice,
    Cors,
    Directories,
    Directory,
    Flag,
    Int,
    Json,
    Listen,
    LogTarget,
    Option,
    Rules,
    Seconds,
    Size,
    Text,
    TokenFile,
    default_cache_dir,
)

# --- the option table --------------------------------------------------------------------------
# One entry per option: name, kind of value, default, help. Keep them in the order --help and
# docs/configuration.md show them.

OPTIONS: tuple[Option, ...] = (
    # fsspec: protocol for target URLs without one, and storage options for targets / SOURCE
    Option("remote_protocol", Text("P"), None,
           "protocol for target URLs that have none (e.g. s3, http)"),
    Option("remote_options", Json(), dict,
           "fsspec storage options for the targets (credentials, endpoint, anon)"),
    Option("target_options", Json(), dict,
           "fsspec storage options for opening SOURCE itself"),
    Option("targets", Rules(), list,
           "rules for targets under a prefix: a list of {\"prefix\", \"rewrite\" (text that "
           "replaces the prefix, or a list of mirrors tried in order), \"options\" (storage "
           "options merged over remote_options), \"credentials\" (a command printing "
           "options that expire)}; the longest matching prefix wins "
           "(docs/configuration.md#target-rules)"),
    # which set, and which revision of it
    Option("format", Choice(("auto", "json", "parquet", "icechunk")), "auto",
           "SOURCE's format: found by its layout (auto), or stated"),
    Option("branch", Text(), None,
           "an Icechunk repository: serve the head of branch NAME (followed as it moves with "
           "reload)", shown_default="main"),
    Option("tag", Text(), None, "an Icechunk repository: serve the snapshot tag NAME names",
           shown_default="none"),
    Option("snapshot", Text("ID"), None, "an Icechunk repository: serve snapshot ID",
           shown_default="none"),
    Option("no_virtual_pins", Flag(False), True,
           "an Icechunk repository: read virtual chunks whose target changed since the "
           "repository recorded its ETag or modification time (by default: EIO)",
           field="virtual_pins"),
    # FUSE and permissions
    Option("allow_other", Flag(), False,
           "let other users access the mount (needs user_allow_other in /etc/fuse.conf for "
           "non-root)"),
    Option("allow_root", Flag(), False, "let root access the mount"),
    Option("uid", Int(0, 2**32 - 2), os.getuid, "owner of all files and directories",
           shown_default="the mounting user"),
    Option("gid", Int(0, 2**32 - 2), os.getgid, "group of all files and directories",
           shown_default="the mounting user's group"),
    Option("umask", Int(0, 0o777, base=8, metavar="OOO"), 0o222,
           "permission bits to remove (222: files 0444, directories 0555)"),
    Option("fsname", Text(), None, "the source shown in /proc/mounts", shown_default="SOURCE"),
    Option("subtype", Text(pytype="str", required=True), "refmount",
           "the type shown in /proc/mounts is fuse.NAME"),
    Option("attr_timeout", Seconds(), 86400.0,
           "how long the kernel may cache names and attributes"),
    Option("max_tasks", Int(1, 100_000), 256, "FUSE requests handled concurrently"),
    # caching
    Option("cache_dir", Directory(), default_cache_dir,
           "persistent cache (index and data blocks)",
           shown_default="~/.cache/refmount, or /var/cache/refmount for root"),
    Option("cache_size", Size(), 10 * 2**30, "bound of the disk block cache; LRU eviction"),
    Option("no_disk_cache", Flag(False), True,
           "keep nothing on disk (the index goes to a temporary file)", field="disk_cache"),
    Option("max_readahead", Size(), 64 * 2**20,
           "largest readahead window, in a file and across keys read in target order (0: off); across "
           "keys also the bytes in flight ahead of readers, all streams together, with the stretches "
           "read ahead held within twice it"),
    Option("read_ahead_kb", Int(0, 2**20), 1024,
           "kernel readahead of the mount in KiB, set when root (0: the kernel's default)"),
    Option("memory_cache", Size(), 512 * 2**20, "bound of the in-memory block cache",
           field="memory_cache_size"),
    Option("whole_fetch_limit", Size(), 32 * 2**20,
           "range references up to this size are fetched whole"),
    Option("block_size", Size(lo=4096), 4 * 2**20,
           "block size for larger ranges and whole-file targets, and the grid on which "
           "stretches read ahead across keys are cached on disk"),
    Option("no_page_push", Flag(False), True,
           "do not store chunks read ahead in the kernel's page cache when they are opened "
           "(each then costs a READ round trip)", field="page_push"),
    Option("no_open", Flag(), False,
           "answer the kernel's first OPEN with ENOSYS: no OPEN or RELEASE request per file after "
           "(a warm file read with os.read costs no request), ranges settled at lookup; needs "
           "pyfuse3 built with patches/pyfuse3-noopen.patch (scripts/setup.sh), else files are "
           "opened; not under a catalogue"),
    Option("decode", Flag(), False,
           "serve every zarr chunk decoded (compressor and filters applied, little-endian) and "
           "each array as netCDF-C's own zarr writer shows it (char, chunks cut to the shape, "
           "scalars, typed attributes), so that readers without the codecs (ncdump, CDO, NCO, "
           "GDAL) read the arrays as the original files describe them; what netCDF-C cannot "
           "read (variable-length strings) is left out of its side, with a warning; Zarr v3 "
           "(zarr.json, sharded arrays one chunk per inner chunk) is shown as v2 "
           "(docs/semantics.md#decoded-view)"),
    Option("max_chunk_bytes", Size(lo=4096), DECODE_MAX_CHUNK_BYTES,
           "with decode: arrays whose decoded chunk is larger are served as referenced, with a "
           "warning; no step of decoding a chunk produces more than its array declares"),
    # fetching
    Option("timeout", Seconds(), 30.0,
           "time limit for one read's fetch, retries included; a read that waited for a "
           "failed readahead of the same bytes gets one more fetch, so EIO comes within "
           "2 x timeout"),
    Option("retries", Int(0, 100), 3, "retries of a failed fetch, with backoff"),
    Option("max_connections", Int(1, 10_000), 32, "concurrent requests to each target host"),
    Option("merge_gap", Size(off_value=-1), 64 * 2**10,
           "ranges of one target requested at once and at most this far apart are fetched by "
           "one request of up to block_size ('off' to disable)"),
    # process and logging
    Option("log", LogTarget(), None,
           "where the daemon logs; without /dev/log, syslog means the file "
           "cache_dir/log/MOUNTPOINT.log", shown_default="stderr with -f, else syslog"),
    Option("log_level", Choice(("debug", "info", "warning", "error")), "info",
           "how much the daemon logs"),
    Option("debug", Flag(), False, "log at debug level, FUSE requests included",
           implies=(("log_level", "debug"),)),
    # what a reference set may do
    Option("bad_keys", Choice(("error", "skip")), "error",
           "refuse a reference set with keys that cannot be paths, or skip those keys with a "
           "warning"),
    Option("allow_local", Directories(), None,
           "local files that references may read",
           shown_default="all for a private mount; for a shared one (allow_other, "
           "allow_root) the directory of a local SOURCE (a Parquet directory itself), none for "
           "a remote SOURCE"),
    Option("pins", Directory(metavar="FILE", pytype="str | None"), None,
           "serve only the versions of the targets that FILE pins (written by refmount verify "
           "SOURCE --pin FILE): a target whose size, ETag or modification time differs, or that "
           "FILE does not pin, gives EIO (HTTP: 502)", shown_default="none"),
    Option("recover", Flag(), False,
           "if MOUNTPOINT is a stale mount left by a killed daemon, clear it first"),
    Option("nonempty", Flag(), False,
           "mount over a MOUNTPOINT that holds files, hiding them until unmounted"),
    # bounds on reading a reference set (refs/limits.py)
    Option("max_inline", Size(lo=1), 64 * 2**20,
           "largest inline value after decoding (also a Parquet 'raw' cell)"),
    Option("max_ratio", Int(0, 2**62), 200,
           "refuse a compressed SOURCE that expands more than N times (beyond its first 64M "
           "of output; 0: no limit)"),
    Option("max_key_depth", Int(1, 4095), 4095,
           "most '/'-separated components of a key (directory inodes keep 12 bits of depth)"),
    Option("max_key_length", Size(lo=1), 64 * 2**10, "longest key, in bytes"),
    Option("max_nesting", Int(2, 512), 256,
           "deepest nesting of JSON arrays and objects in SOURCE"),
    Option("max_keys", Int(1, 2**40), 20_000_000,
           "most keys of a JSON set, Version 1 gen products included (a gen entry that would "
           "pass it is refused before any key is made)"),
    Option("max_generated", Size(lo=1), 512 * 2**20,
           "most bytes of keys and distinct URLs a Version 1 set may make (refs and gen "
           "together; a gen entry whose fixed text alone passes it is refused before any key "
           "is made)"),
    Option("max_template_seconds", Seconds(), 10.0,
           "CPU seconds all Version 1 template renderings of a set may take together (one "
           "rendering: at most 2 s)"),
    Option("max_record", Size(lo=1 << 20), 64 * 2**20,
           "most bytes a Parquet record file may decode to; a larger one gives EIO for its keys"),
    Option("max_source", Size(lo=0), 2 * 2**30,
           "most bytes of SOURCE read, after any decompression (0: no limit); also the most "
           "bytes of inline chunks one Icechunk manifest makes, each reference counted"),
    Option("max_metadata", Size(lo=1), 256 * 2**20,
           "most bytes of metadata (zarr.json) an Icechunk snapshot's nodes make together, each "
           "node counted even where nodes share one stored document"),
    # catalogues: many reference sets under one mount (sets/catalog.py)
    Option("catalog", Flag(), False,
           "SOURCE is a catalogue: a directory of reference sets, a list file or a STAC "
           "Collection/ItemCollection; each set is a directory of the mount"),
    Option("max_open_sets", Int(1, 100_000), 64,
           "with catalog: most sets open at once (the least recently used is closed)"),
    Option("max_open_memory", Size(), 1 << 30,
           "with catalog: most bytes the open sets may hold at once, those in use included (each "
           "its index, its memory cache and a Parquet set's 256M of decoded records); a set that "
           "would pass it is not opened (EIO, HTTP 503) until others close, a reload that would "
           "keeps the old version"),
    Option("max_sets", Int(1, 10_000_000), 100_000,
           "with catalog: most sets a catalogue may name"),
    Option("reload", Seconds(zero=True), 0.0,
           "check SOURCE (with catalog: the catalogue) and every opened set for changes every "
           "SEC seconds and on SIGUSR1; a changed set is indexed again and swapped in, files "
           "already open keep reading the old one (0: off; a catalogue is still checked on "
           "SIGUSR1)"),
    # metrics for Prometheus
    Option("metrics", Listen(metavar="[HOST:]PORT", pytype="str | None", port_alone=True), None,
           "answer Prometheus' scrapes at http://HOST:PORT/metrics, no token asked (PORT alone: "
           "on 127.0.0.1; another host's address lets other hosts read the counters, logged as "
           "a warning); refmount serve has them at /.refmount/metrics in any case, behind its "
           "auth_token (docs/operations.md#metrics)",
           shown_default="off"),
    # serving over HTTP (refmount serve)
    Option("listen", Listen(), "127.0.0.1:8080",
           "refmount serve: the address and port to listen on (a non-loopback address "
           "serves other hosts: an explicit choice)"),
    Option("cors", Cors(), None,
           "refmount serve: the origin browsers may read from (Access-Control-Allow-Origin "
           "on every response), * for any", shown_default="no CORS headers"),
    Option("auth_token", TokenFile(), None,
           "refmount serve: require 'Authorization: Bearer TOKEN', the token read from FILE",
           shown_default="none"),
    Option("max_clients", Int(1, 100_000), 256,
           "refmount serve: client connections open at once; more are answered 503 and closed"),
    Option("client_timeout", Seconds(), 60.0,
           "refmount serve: a client that reads nothing of its response (or sends nothing "
           "on an idle connection) for this long is disconnected"),
    # the S3 dialect of refmount serve (http/s3dialect.py)
    Option("s3_listen", Listen(pytype="str | None"), None,
           "refmount serve: also answer S3 requests (path-style, read-only) on HOST:PORT "
           "(--s3-listen)", shown_default="off"),
    Option("s3_bucket", Text(metavar="NAME"), None,
           "refmount serve with s3_listen: the bucket name of a set served alone",
           shown_default="SOURCE's last component"),
    Option("s3_region", Text(metavar="REGION", pytype="str"), "us-east-1",
           "refmount serve with s3_listen: the region the buckets say they are in (and SigV4 "
           "scopes name)"),
    Option("s3_access_key", Text(metavar="KEY_ID"), None,
           "refmount serve with s3_listen: accept only requests signed (AWS SigV4) with this "
           "access key id and s3_secret_key", shown_default="anonymous"),
    Option("s3_secret_key", TokenFile(), None,
           "refmount serve with s3_listen: the secret access key of s3_access_key, read from "
           "FILE", shown_default="none"),
    Option("s3_max_skew", Seconds(), 900.0,
           "refmount serve with s3_listen: most seconds a signed request's time may differ "
           "from the server's"),
)

OPTIONS_BY_NAME: dict[str, Option] = {o.name: o for o in OPTIONS}


@dataclass
class _MountBase:
    """What the command line gives besides ``-o`` options, and behaviour of the config."""

    source: str = ""
    mountpoint: str = ""
    foreground: bool = False
    serving: bool = False  # refmount serve: a shared service, confined as allow_other
    # a catalogue's set in a shared mount: its local SOURCE files are opened beneath these
    # directories (the catalogue's, or allow_local), no symlink followed
    source_roots: list[str] | None = None
    # -o pins: the table the CLI parsed the pin file into, for the serving process to map
    # (targets/pinhandover.py)
    pins_table: str | None = None

    def object_roots(self) -> list[str] | None:
        """Where a set's own local files are opened, confined (``Limits.source_roots``): a
        catalogue's set's ``source_roots``; for a shared mount or server of a local directory
        (an Icechunk repository, a Parquet set), that directory (symlinks resolved): its
        objects beneath it, no symlink followed; None: opened as named."""
        if self.source_roots is not None:
            return self.source_roots
        if not (self.allow_other or self.allow_root or self.serving) or not is_local(self.source):  # type: ignore[attr-defined]
            return None
        real = os.path.realpath(local_path(self.source))
        return [real] if os.path.isdir(real) else None

    def local_roots(self) -> list[str]:
        """Directories local targets may lie under (``allow_local``, or its default)."""
        allow_local: list[str] | None = self.allow_local  # type: ignore[attr-defined]
        if allow_local is not None:
            return allow_local
        if not (self.allow_other or self.allow_root or self.serving):  # type: ignore[attr-defined]
            return ["/"]
        if is_local(self.source):
            real = os.path.realpath(local_path(self.source))  # a directory is a Parquet set: itself
            return [real if os.path.isdir(real) else os.path.dirname(real)]
        return []


def _field(option: Option) -> tuple[str, str, Any]:
    d = option.default
    spec = field(default_factory=d) if callable(d) else field(default=d)
    return option.attr, option.kind.pytype, spec


MountConfig = dataclasses.make_dataclass(
    "MountConfig",
    [_field(o) for o in OPTIONS],
    bases=(_MountBase,),
    namespace={"__module__": __name__,
               "__doc__": "Everything that tunes a mount: SOURCE, MOUNTPOINT, -f and one "
                          "field per entry of OPTIONS."},
)


# Generic mount(8)/mount.fuse3 options that a filesystem helper must accept (and may ignore).
IGNORED_OPTIONS = frozenset(
    {"ro", "rw", "nodev", "nosuid", "noexec", "exec", "dev", "suid", "auto", "noauto",
     "_netdev", "nofail", "user", "users", "defaults", "noatime", "relatime", "atime",
     "default_permissions", "async", "sync"}
)


def did_you_mean(word: str, known: Iterable[str]) -> str:
    """``": did you mean 'x'?"`` for the closest known word, or nothing."""
    close = difflib.get_close_matches(word, list(known), n=1, cutoff=0.6)
    return f": did you mean {close[0]!r}?" if close else ""


def apply_options(cfg: Any, options: list[str]) -> None:
    """Apply ``-o`` options (already split) to ``cfg``; raises ConfigError on bad ones."""
    for opt in options:
        name, sep, value = opt.partition("=")
        name = name.strip()
        if name in IGNORED_OPTIONS or name == "comment" or name.startswith(("x-systemd.", "x-")):
            continue
        option = OPTIONS_BY_NAME.get(name)
        if option is None:
            raise ConfigError(f"unknown option {name!r}{did_you_mean(name, OPTIONS_BY_NAME)} "
                              "(see refmount --help)")
        if isinstance(option.kind, Flag):
            if sep:
                raise ConfigError(f"option {name!r} takes no value")
        elif not sep:
            raise ConfigError(f"option {name!r} needs a value ({option.spec})")
        setattr(cfg, option.attr, option.kind.parse(name, value))
        for attr, implied in option.implies:
            setattr(cfg, attr, implied)


# --- renderings of the table -------------------------------------------------------------------


def describe_options(cfg: Any) -> str:
    """The options that differ from their defaults, as ``-o`` would write them (for the log's
    start line). JSON options show their keys only: the values may be credentials."""
    shown = []
    for o in OPTIONS:
        value = getattr(cfg, o.attr)
        default = o.default() if callable(o.default) else o.default
        if value == default:
            continue
        if isinstance(o.kind, Flag):
            if value == o.kind.sets:
                shown.append(o.name)
            continue
        if isinstance(o.kind, Json):
            text = "{" + ",".join(f'"{k}":***' for k in value) + "}"
        else:
            text = o.kind.show(value)
        shown.append(f"{o.name}={text}")
    return ",".join(shown) or "defaults"



def options_help(width: int = 100) -> str:
    """The ``-o`` part of ``refmount --help``: one entry per option, its default last."""
    col = 28
    lines = []
    for o in OPTIONS:
        text = f"{o.help} (default: {o.shown()})"
        body = textwrap.wrap(text, width - col)
        if len(o.spec) > col - 4:
            lines.append(f"  {o.spec}")
            body_lines = body
        else:
            lines.append(f"  {o.spec:<{col - 2}}{body[0]}")
            body_lines = body[1:]
        lines.extend(" " * col + more for more in body_lines)
    return "\n".join(lines)


def options_markdown() -> str:
    """The options table of docs/configuration.md."""
    def cell(text: str) -> str:
        return text.replace("|", "\\|")

    rows = ["| option | default | meaning |", "| --- | --- | --- |"]
    rows += [f"| `{cell(o.spec)}` | {cell(o.shown())} | {cell(o.help)} |" for o in OPTIONS]
    return "\n".join(rows)
