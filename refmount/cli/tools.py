"""Commands that work on reference sets or mounts without serving one:
``refmount expand`` (write the Version 0 equivalent), ``refmount inspect`` (summarise),
``refmount stats`` (a mount's counters)."""

from __future__ import annotations

import base64
import contextlib
import errno
import itertools
import json
import os
from collections.abc import Iterator
from typing import IO, Any

from refmount.base.errors import ConfigError
from refmount.base.progress import Progress
from refmount.base.redact import redact_url
from refmount.refs import Ref, RefKind, detect_format
from refmount.targets.rules import TargetRules

# ---- reading any reference set as (key, Ref) pairs -------------------------------------------


def iter_references(source: str, target_options: dict[str, Any], progress: Progress | None = None,
                    quirks: dict[str, int] | None = None, *, format: str | None = None,
                    revision: dict[str, str] | None = None) -> Iterator[tuple[str, Ref]]:
    """(key, Ref) pairs; ``quirks`` (when given) receives the producer quirks accepted;
    ``format`` and ``revision`` as ``-o format=`` and ``-o branch=``/``tag=``/``snapshot=``."""
    fmt = detect_format(source, target_options, format)
    pairs = fmt.references(source, target_options, quirks, revision=revision)
    for pair in pairs:
        if progress is not None:
            progress.count += 1
        yield pair


# ---- expand -------------------------------------------------------------------------------


def ref_to_json(ref: Ref) -> Any:
    if ref.kind is RefKind.INLINE:
        assert ref.data is not None
        data = bytes(ref.data)  # an Icechunk inline chunk is a view of its manifest
        try:
            text = data.decode()
            if not text.startswith("base64:"):
                return text
        except UnicodeDecodeError:
            pass
        return "base64:" + base64.b64encode(data).decode()
    if ref.kind is RefKind.WHOLE:
        return [ref.url]
    return [ref.url, ref.offset, ref.length]


def expand(source: str, out: IO[str], target_options: dict[str, Any], *, format: str | None = None,
           revision: dict[str, str] | None = None) -> int:
    """Stream the Version 0 equivalent of any reference set to ``out``; returns key count."""
    progress = Progress(f"expanding {redact_url(source)}")
    n = 0
    try:
        pairs = iter_references(source, target_options, progress, format=format, revision=revision)
        first = next(pairs, None)  # parse errors surface before anything is written
        out.write("{")
        if first is not None:
            for key, ref in itertools.chain([first], pairs):
                out.write(("\n" if n == 0 else ",\n") + json.dumps(key) + ": " + json.dumps(ref_to_json(ref)))
                n += 1
        out.write("\n}\n" if n else "}\n")
    finally:
        progress.close()
    return n


# ---- inspect ------------------------------------------------------------------------------

REVISION_OPTIONS = ("branch", "tag", "snapshot")


def revision_of(flags: dict[str, str | None], options: list[str]) -> dict[str, str]:
    """The revision an Icechunk repository is read at, from ``--branch``/``--tag``/
    ``--snapshot`` and from ``-o`` in a mount's form (``-o tag=v1``, comma-separated as a
    mount takes them). ConfigError for any other ``-o`` option or one revision named twice
    differently; two kinds together are refused where the repository is opened."""
    revision = {k: v for k, v in flags.items() if v}
    for item in options:
        for part in item.split(","):
            name, sep, value = part.partition("=")
            name = name.strip()
            if name not in REVISION_OPTIONS or not sep or not value:
                raise ConfigError(f"-o {part}: here -o takes branch=NAME, tag=NAME or snapshot=ID "
                                  "(an Icechunk repository's revision, as a mount takes it)")
            if revision.get(name, value) != value:
                raise ConfigError(f"--{name} {revision[name]} and -o {name}={value} name two revisions")
            revision[name] = value
    return revision



def inspect(source: str, target_options: dict[str, Any],
            rules: TargetRules | None = None, *, format: str | None = None,
            revision: dict[str, str] | None = None) -> dict[str, Any]:
    progress = Progress(f"reading {redact_url(source)}")
    keys = inline_bytes = referenced = whole = 0
    targets: set[str] = set()
    arrays: dict[str, dict[str, Any]] = {}
    metadata: dict[str, bytes | None] = {}  # .zarray and .zmetadata keys, for the decoded view
    stored: dict[str, list[int]] = {}  # directory -> [chunk-like keys, their referenced bytes]
    quirks: dict[str, int] = {}
    try:
        for key, ref in iter_references(source, target_options, progress, quirks, format=format,
                                        revision=revision):
            keys += 1
            head, _, name = key.rpartition("/")
            if name.endswith((".zarray", ".zmetadata")) or name == "zarr.json":
                metadata[key] = ref.data if ref.kind is RefKind.INLINE else None
            elif name[:1].isdigit() or name == "c":  # "c": a 0-d array's chunk (default keys)
                tally = stored.setdefault(head, [0, 0])
                tally[0] += 1
                tally[1] += max(ref.length, 0)
            if ref.kind is RefKind.INLINE:
                inline_bytes += ref.length
                if key == ".zarray" or key.endswith("/.zarray"):
                    try:
                        meta = json.loads(bytes(ref.data or b""))
                    except ValueError:
                        meta = {}
                    path = key[: -len("/.zarray")] if "/" in key else ""
                    arrays[path] = {
                        "shape": meta.get("shape"),
                        "chunks": meta.get("chunks"),
                        "dtype": meta.get("dtype"),
                        "compressor": (meta.get("compressor") or {}).get("id")
                        if isinstance(meta.get("compressor"), dict) else meta.get("compressor"),
                        "filters": [f.get("id") for f in meta.get("filters") or [] if isinstance(f, dict)],
                    }
            else:
                assert ref.url is not None
                targets.add(ref.url)
                if ref.kind is RefKind.WHOLE:
                    whole += 1
                else:
                    referenced += ref.length
    finally:
        progress.close()
    _decoded_sizes(arrays, metadata, stored)
    routed = _routes(source, targets, rules) if rules else None
    fmt = detect_format(source, target_options, format)
    described = fmt.describe(source, target_options, revision)
    return {
        "source": redact_url(source),  # printed: no user:password@, tokens or signatures
        "format": fmt.name,
        **({"revision": described} if described else {}),
        "keys": keys,
        "arrays": arrays,
        "targets": len(targets),
        "referenced_bytes": referenced,
        "whole_file_refs": whole,
        "inline_bytes": inline_bytes,
        "quirks": quirks,
        **({"target_rules": routed} if routed is not None else {}),
    }


SHOWN_UNMATCHED = 20  # targets no rule matches, listed by inspect (all are counted)


def _routes(source: str, targets: set[str], rules: TargetRules) -> dict[str, Any]:
    """Where the targets are read under ``rules`` (resolved as a mount of ``source`` would):
    per rule, how many targets it applies to and one of them, original and resolved; the
    targets no rule matches. Redacted."""
    from refmount.config import MountConfig
    from refmount.targets.policy import target_policy

    policy = target_policy(MountConfig(source=source))
    per_rule: dict[int, dict[str, Any]] = {
        r.number: {"rule": r.describe(), "targets": 0} for r in rules.rules}
    unmatched: list[str] = []
    for url in sorted(targets):
        route = policy.route(rules, url)
        if route.rule is None:
            unmatched.append(redact_url(url))
            continue
        entry = per_rule[route.rule.number]
        entry["targets"] += 1
        entry.setdefault("example", {"original": redact_url(url),
                                     "resolved": [redact_url(u) for u in route.urls]})
    return {"rules": list(per_rule.values()), "unmatched": len(unmatched),
            "unmatched_targets": unmatched[:SHOWN_UNMATCHED]}


def _decoded_sizes(arrays: dict[str, dict[str, Any]], metadata: dict[str, bytes | None],
                   stored: dict[str, list[int]]) -> None:
    """Per array: its codecs (decoding order), the referenced bytes of its chunks, their size
    served decoded (``-o decode``), and why it would be served as referenced instead."""
    from refmount.decode.view import DecodedView

    view = DecodedView(metadata)
    for path, meta in view.v3.metas.items():  # Zarr v3 arrays (zarr.json)
        arrays.setdefault(path, {"shape": meta.shape, "chunks": meta.chunk_shape, "dtype": str(meta.dtype),
                                 "compressor": "zarr v3", "filters": []})
    totals: dict[str, list[int]] = {}
    for head, (n, nbytes) in stored.items():
        probe = view.array_of(f"{head}/0" if head else "0")  # any directory of a decoded array
        path = head
        if probe is None:  # nested chunk directories (dimension_separator "/"): go up
            while path and path not in arrays:
                path = path.rpartition("/")[0]
        else:
            path = probe.path
        if path in arrays:
            t = totals.setdefault(path, [0, 0])
            t[0] += n
            t[1] += nbytes
    for path, a in arrays.items():
        n, nbytes = totals.get(path, [0, 0])
        array = view.arrays.get(path)
        a["codecs"] = view.codecs.get(path, [])
        a["chunks_referenced"] = n
        a["stored_bytes"] = nbytes
        per_stored = getattr(getattr(array, "shard", None), "count", 1)  # a shard's inner chunks
        a["decoded_bytes"] = n * per_stored * array.nbytes if array is not None else nbytes
        if (path or "/") in view.left_out:
            a["netcdf"] = "left out: " + view.left_out[path or "/"]
        a["decode"] = ("decoded" if array is not None
                       else "as referenced: " + view.skipped[path or "/"] if (path or "/") in view.skipped
                       else "as referenced (nothing to decode)")


def format_inspect(info: dict[str, Any]) -> str:
    pairs = [
        ("source", info["source"]),
        ("format", info["format"]),
        *((name.replace("_", " "), value) for name, value in info.get("revision", {}).items()),
        ("keys", f"{info['keys']:,}"),
        ("distinct targets", f"{info['targets']:,}"),
        ("referenced bytes", f"{info['referenced_bytes']:,} ({human(info['referenced_bytes'])})"
         + (f" + {info['whole_file_refs']} whole-file refs" if info["whole_file_refs"] else "")),
        ("inline bytes", f"{info['inline_bytes']:,} ({human(info['inline_bytes'])})"),
        ("arrays", str(len(info["arrays"]))),
    ]
    for i, (what, n) in enumerate(sorted(info.get("quirks", {}).items())):
        pairs.append(("quirks accepted" if i == 0 else "", f"{n:,} {what}"))
    width = max(len(label) for label, _ in pairs) + 2  # every label apart from its value
    lines = [f"{label:{width}}{value}" for label, value in pairs]
    if "target_rules" in info:
        lines.extend(_format_routes(info["target_rules"]))
    if info["arrays"]:
        rows = [("array", "shape", "chunks", "dtype", "compressor", "codecs (decoding order)",
                 "stored", "decoded")]
        for path, a in sorted(info["arrays"].items()):
            comp = a["compressor"] or "-"
            if a["filters"]:
                comp += " (" + ",".join(map(str, a["filters"])) + ")"
            rows.append((path or "/", str(a["shape"]), str(a["chunks"]), str(a["dtype"]), comp,
                         ",".join(a["codecs"]) or "-", human(a["stored_bytes"]),
                         human(a["decoded_bytes"])))
        lines.append("")
        lines.extend(_table(rows))
        skipped = [(p or "/", a["decode"]) for p, a in sorted(info["arrays"].items())
                   if a["decode"].startswith("as referenced: ")]
        if skipped:
            lines.append("")
            lines.append("not decoded with -o decode (served as referenced):")
            lines.extend(f"  {p}: {why[len('as referenced: '):]}" for p, why in skipped)
        left_out = [(p or "/", a["netcdf"]) for p, a in sorted(info["arrays"].items()) if "netcdf" in a]
        if left_out:
            lines.append("")
            lines.append("not seen by netCDF clients with -o decode (zarr reads them):")
            lines.extend(f"  {p}: {why[len('left out: '):]}" for p, why in left_out)
    return "\n".join(lines)


def _format_routes(routed: dict[str, Any]) -> list[str]:
    lines = ["", "target rules (longest prefix wins):"]
    for r in routed["rules"]:
        lines.append(f"  rule {r['rule']}: {r['targets']:,} targets")
        if "example" in r:
            lines.append(f"    e.g. {r['example']['original']}")
            lines.extend(f"      -> {u}" for u in r["example"]["resolved"])
    lines.append(f"  no rule: {routed['unmatched']:,} targets")
    lines.extend(f"    {u}" for u in routed["unmatched_targets"])
    if routed["unmatched"] > len(routed["unmatched_targets"]):
        lines.append(f"    ... and {routed['unmatched'] - len(routed['unmatched_targets']):,} more")
    return lines


# ---- stats --------------------------------------------------------------------------------

STATS_XATTR = "user.refmount.stats"


# what a mount of an Icechunk repository says of it (the root's user.refmount.* attributes)
REPOSITORY_ROWS = ("repository", "format_version", "revision", "snapshot", "snapshot_time")


def read_stats(mountpoint: str) -> dict[str, Any]:
    try:
        raw = os.getxattr(mountpoint, STATS_XATTR)
    except OSError as e:
        if e.errno == errno.ENOTCONN:
            raise RuntimeError(f"{mountpoint}: stale mount (its daemon died); clear it with "
                               f"'fusermount3 -uz {mountpoint}'") from None
        raise RuntimeError(f"{mountpoint}: not a refmount mount ({e.strerror})") from None
    stats = json.loads(raw)
    for name in ("source", "format", *REPOSITORY_ROWS, "keys", "targets", "log"):
        with contextlib.suppress(OSError):
            value = os.getxattr(mountpoint, f"user.refmount.{name}").decode()
            stats[name] = int(value) if value.isdigit() else value
    return stats


def read_server_stats(url: str, timeout: float = 10.0) -> dict[str, Any]:
    """The counters of a ``refmount serve`` server at base URL ``url``."""
    import urllib.error
    import urllib.request

    from refmount.http.frontend import STATS_PATH

    where = url.rstrip("/") + STATS_PATH
    try:
        with urllib.request.urlopen(where, timeout=timeout) as f:
            return dict(json.loads(f.read()))
    except (urllib.error.URLError, OSError, ValueError) as e:
        raise RuntimeError(f"{redact_url(url)}: not a refmount server ({e})") from None


FUSE_ONLY = frozenset({"lookups", "opens", "pushed", "open_files"})  # counted by a mount only


def format_stats(stats: dict[str, Any]) -> str:
    order = [
        ("source", "source"), ("repository", "repository"), ("format_version", "format version"),
        ("revision", "branches, tags"), ("snapshot", "snapshot (mounted)"),
        ("snapshot_time", "snapshot time"), ("keys", "keys"), ("uptime", "uptime (s)"),
        ("lookups", "FUSE lookups"), ("opens", "FUSE opens"), ("reads", "FUSE reads"),
        ("bytes_read", "bytes returned"),
        ("requests", "fetches from targets"), ("bytes_fetched", "bytes fetched"),
        ("merged", "ranges in merged fetches"),
        ("prefetched", "bytes read ahead across keys"), ("prefetch_hits", "reads served from those"),
        ("readahead_streams", "streams read ahead across keys"),
        ("pushed", "bytes stored in the page cache at open"),
        ("decoded", "chunks decoded (-o decode)"), ("decoded_ahead", "of those, decoded ahead"),
        ("memory_hits", "memory cache hits"), ("disk_hits", "disk cache hits"),
        ("misses", "cache misses"), ("cache_writes_dropped", "blocks not written to disk"),
        ("retries", "retries"), ("errors", "errors"),
        ("pin_refusals", "reads refused by pins"),
        ("pinned_targets_changed", "pinned targets changed"),
        ("open_files", "open files"),
        ("http_requests", "HTTP requests"), ("http_bytes_sent", "HTTP bytes sent"),
        ("http_status", "HTTP responses by status"), ("http_aborted", "HTTP responses cut off"),
        ("http_connections", "HTTP connections open"), ("http_refused", "HTTP connections refused"),
    ]
    if "http_requests" in stats:  # a server's: its counters in HTTP's words, none of FUSE's
        order = [(k, "key reads" if k == "reads" else label) for k, label in order
                 if k not in FUSE_ONLY]
    rows = [(label, f"{stats[k]:,}" if isinstance(stats.get(k), int) else str(stats.get(k, "-")))
            for k, label in order if k in stats]
    last = stats.get("last_error")
    if last:
        target = f" ({last['target']})" if last.get("target") else ""
        rows.append(("last error", f"{last['time']} {last['key']}{target}: {last['reason']}"))
    for number, c in sorted((stats.get("credentials") or {}).items()):
        failures = c.get("failures", 0)
        state = (f"failing ({failures} failed run{'' if failures == 1 else 's'})"
                 if c.get("failing")
                 else "ok" if c.get("generation") else "waiting for the first")
        valid = (f"generation {c['generation']}, valid until {c.get('expiry') or 'further notice'}"
                 if c.get("generation") else "no credential yet")
        rows.append((f"credentials, rule {number}", f"{state}: {valid}"))
    rows += _set_rows(stats)
    if stats.get("log"):
        rows.append(("log", str(stats["log"])))
    return "\n".join(_table(rows, header=False))


SET_ROWS = 20  # sets shown one per row by ``refmount stats``; the rest are counted


def _set_rows(stats: dict[str, Any]) -> list[tuple[str, str]]:
    """A catalogue's (or a reloaded set's) rows: the sets, the reload checks, each set that
    is open or failed."""
    rows: list[tuple[str, str]] = []
    if "sets" in stats:
        rows.append(("sets", f"{stats['sets']:,} ({stats.get('sets_open', 0)} open, at most "
                             f"{stats.get('max_open_sets', '-')})"))
    if "reload" in stats:
        every = stats["reload"]
        when = f"every {every:g} s and on SIGUSR1" if isinstance(every, float | int) else "on SIGUSR1"
        last = f", last {stats['last_check']}" if stats.get("last_check") else ""
        rows.append(("reload checks", f"{stats.get('reload_checks', 0)} ({when}{last})"))
    if stats.get("catalog_error"):
        rows.append(("catalogue error", str(stats["catalog_error"])))
    states = stats.get("set_states") or {}
    for name, state in list(states.items())[:SET_ROWS]:
        text = str(state.get("state"))
        if state.get("version"):
            text += f", version {state['version']}"
        if state.get("snapshot"):
            text += f", snapshot {state['snapshot']}"
        if state.get("open_files"):
            text += f", {state['open_files']} open files"
        if state.get("last_reload"):
            text += f", reloaded {state['last_reload']}"
        if state.get("error"):
            text += f", error: {state['error']}"
        rows.append((f"set {name or '/'}", text))
    if len(states) > SET_ROWS:
        rows.append(("", f"and {len(states) - SET_ROWS} more sets (--json lists them)"))
    return rows


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if abs(n) < 1024 or unit == "PiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def _table(rows: list[tuple[str, ...]], header: bool = True) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    out = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]
    if header:
        out.insert(1, "  ".join("-" * w for w in widths))
    return out
