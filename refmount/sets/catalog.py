"""Catalogues: many reference sets named by one SOURCE, and the identity of each set.

A catalogue (``-o catalog``) is one of three forms, told apart by what CATALOG is:

1. **a directory of reference sets** (local or any fsspec URL that lists; an HTTP listing
   URL ends with ``/``): every JSON set (``.json``, or ``.json`` + a compression suffix
   fsspec infers: ``.gz``, ``.bz2``, ``.xz``, ``.lzma``, ``.zst``, ``.zip``) and every Parquet
   reference directory (one holding ``.zmetadata``) directly inside it. A set's name is its
   entry's name without those suffixes (``era5.json.gz`` -> ``era5``, ``run.parq/`` ->
   ``run``; ``.parq`` and ``.parquet`` are stripped from a directory). Hidden entries and
   anything else are ignored;
2. **a list file** (JSON, or YAML for ``.yaml``/``.yml``): ``{"sets": {NAME: SOURCE | {"source":
   SOURCE, "options": "decode,timeout=30" | {"decode": true, ...}}}}``; a relative SOURCE is
   relative to the list file's directory;
3. **a STAC Collection, ItemCollection or Item** (JSON): one set per asset that is a kerchunk
   reference file (roles ``references`` or ``index`` with a JSON or Parquet media type), named
   by its item's id (``ID.ASSET`` when an item has several such assets; a Collection's own
   assets by their key); a Collection's ``item`` links are followed.

Each entry's ``options`` are ``-o`` options for that set only (:data:`PER_SET_OPTIONS`),
validated against ``config.OPTIONS``; ``CatalogEntry.option_args`` renders them for
``config.apply_options``. Names are checked (:func:`name_problem`): an entry with a name that
cannot be a directory is skipped with a warning. Two entries with one name are an error.

Everything here is synchronous (the daemon calls it in a worker thread) and bounded:
``max_sets`` entries, ``max_bytes`` read from list and STAC documents (all of them together),
``timeout`` for each remote call. Bad input raises :class:`CatalogError`, one line.

:func:`source_identity` is a short string that changes when a set changes: the size and
modification stamp of its file, or for a Parquet directory those of ``.zmetadata`` and of
every record file.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import posixpath
import re
import stat
import urllib.parse
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from fsspec.core import url_to_fs
from fsspec.utils import infer_compression

from refmount.base.errors import ConfigError
from refmount.base.redact import redact_url
from refmount.base.urls import is_chained, is_local, local_path, protocol
from refmount.config import OPTIONS_BY_NAME, Flag, Json, did_you_mean, split_options
from refmount.refs.deadline import SourceTimeout, within
from refmount.refs.model import ReferenceSetError
from refmount.refs.source import open_source

log = logging.getLogger(__name__)

T = TypeVar("T")

# Options a catalogue may give one set. The others apply to the whole mount (FUSE and
# permissions, caches, logging, serving) or are the operator's bounds on what a set may cost
# (max_*, allow_local), which a catalogue must not raise.
PER_SET_OPTIONS = frozenset({
    "remote_protocol", "remote_options", "target_options", "decode", "max_chunk_bytes",
    "timeout", "retries", "bad_keys", "whole_fetch_limit", "merge_gap",
})
PARQUET_SUFFIXES = (".parquet", ".parq")  # stripped from a Parquet reference directory's name
LIST_SUFFIXES_YAML = (".yaml", ".yml")
STAC_REFERENCE_ROLES = frozenset({"references", "index"})
STAC_JSON_TYPES = frozenset({"application/json", "application/x-json", "text/json"})
STAC_PARQUET_TYPES = frozenset({"application/x-parquet", "application/vnd.apache.parquet",
                                "application/parquet"})
MAX_NAME_BYTES = 255
ZARR_KEYS = (".zgroup", ".zattrs", ".zarray", ".zmetadata")  # a reference set's, not a catalogue's
MAX_NESTING = 64  # of a YAML list file (a JSON one is orjson's: 1024)
PROBES = 16  # remote directories of a catalogue asked at once whether they are Parquet sets
_CONTROL = re.compile("[\x00-\x1f\x7f]")


class CatalogError(ValueError):
    """The catalogue cannot be read; ``str()`` is one line naming the problem and the remedy."""


@dataclass(frozen=True)
class CatalogEntry:
    name: str  # the set's directory name in the mount / path segment over HTTP
    source: str  # the reference set's URL or path (as SOURCE of a single-set mount)
    options: dict[str, str] = field(default_factory=dict)  # per-set options ("" for a flag)

    def option_args(self) -> list[str]:
        """The options as ``-o`` items (``["decode", "timeout=30"]``) for
        ``config.apply_options``."""
        return [name if isinstance(OPTIONS_BY_NAME[name].kind, Flag) else f"{name}={value}"
                for name, value in self.options.items()]


def name_problem(name: object) -> str | None:
    """Why ``name`` cannot name a set's directory, or None."""
    if not isinstance(name, str) or not name:
        return "empty or not text"
    if name in (".", ".."):
        return f"{name!r} is not a name"
    if "/" in name:
        return "contains '/'"
    if _CONTROL.search(name):
        return "contains a control character"
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:  # a file name's undecodable bytes, as os.fsdecode keeps them
        return "not UTF-8"
    if size > MAX_NAME_BYTES:
        return f"longer than {MAX_NAME_BYTES} bytes"
    return None


# --- reading a catalogue -----------------------------------------------------------------------


def read_catalog(url: str, storage_options: dict[str, Any], *, max_sets: int, max_bytes: int,
                 timeout: float) -> dict[str, CatalogEntry]:
    """name -> entry, sorted by name. ``max_sets``: most entries (more is an error);
    ``max_bytes``: most bytes of list and STAC documents read, all together, after
    decompression (0: no limit); ``timeout``: seconds for each remote call. CatalogError (one
    line) when CATALOG is not a catalogue, cannot be read, or passes a bound."""
    reader = _Reader(url, dict(storage_options), max_sets, max_bytes, timeout)
    try:
        entries = reader.read()
    except CatalogError as e:
        raise CatalogError(redact_url(str(e))) from None
    except (ReferenceSetError, ConfigError) as e:
        raise CatalogError(redact_url(str(e))) from None
    except RecursionError:
        raise CatalogError(f"{redact_url(url)}: nested too deeply") from None
    except FileNotFoundError:
        raise CatalogError(f"{redact_url(url)}: no such file or directory") from None
    except PermissionError:
        raise CatalogError(f"{redact_url(url)}: permission denied") from None
    except OSError as e:
        raise CatalogError(redact_url(f"{url}: cannot read ({e.strerror or e})")) from None
    except ImportError as e:
        raise CatalogError(f"{redact_url(url)}: missing support for this URL ({e})") from None
    except Exception as e:  # a storage library's own errors (aiohttp's 403, botocore's, ...)
        text = str(e).splitlines()[0] if str(e) else ""
        raise CatalogError(redact_url(f"{url}: cannot read ({type(e).__name__}: {text})")) \
            from None
    return dict(sorted(entries.items()))


class _Reader:
    def __init__(self, url: str, options: dict[str, Any], max_sets: int, max_bytes: int,
                 timeout: float) -> None:
        self.url = url
        self.options = options
        self.max_sets = max_sets
        self.max_bytes = max_bytes
        self.timeout = timeout
        self.local = is_local(url)
        self.bytes_read = 0  # of list and STAC documents, against max_bytes
        self.entries: dict[str, CatalogEntry] = {}
        self.origin: dict[str, str] = {}  # name -> what gave it (for a collision's message)

    # --- plumbing ---

    def call(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` within the timeout for a remote catalogue."""
        return within(None if self.local else self.timeout, redact_url(self.url), fn, *args)

    def add(self, name: str, source: str, options: dict[str, str], origin: str) -> None:
        problem = name_problem(name)
        if problem is not None:
            log.warning("catalogue %s: skipped the set named %r (%s)", redact_url(self.url),
                        name, problem)
            return
        if name in self.entries:
            raise CatalogError(
                f"{self.url}: two sets are named {name!r} ({self.origin[name]} and {origin}); "
                "rename one")
        if len(self.entries) >= self.max_sets:
            raise CatalogError(f"{self.url}: more than {self.max_sets:,} reference sets (limit "
                               "max_sets); raise max_sets or split the catalogue")
        self.entries[name] = CatalogEntry(name, source, options)
        self.origin[name] = origin

    def read_document(self, url: str) -> bytes:
        """A list or STAC document, within what is left of ``max_bytes``."""
        left = self.max_bytes - self.bytes_read if self.max_bytes else 0
        if self.max_bytes and left <= 0:
            raise CatalogError(f"{url}: the catalogue's documents pass {self.max_bytes:,} bytes "
                               "in all; raise the limit or split the catalogue")
        timeout = None if is_local(url) else self.timeout
        with open_source(url, self.options, timeout=timeout, max_bytes=0) as f:
            data = f.read(left + 1) if left else f.read()
        if left and len(data) > left:
            raise CatalogError(f"{url}: more than {self.max_bytes:,} bytes of catalogue "
                               "documents; raise the limit or split the catalogue")
        self.bytes_read += len(data)
        return data

    # --- the forms ---

    def read(self) -> dict[str, CatalogEntry]:
        fs, path = url_to_fs(self.url, **self.options)
        fs.invalidate_cache(path)  # a listing the file system keeps would hide a change
        if self._is_directory(fs, path):
            self.read_directory(fs, path)
            return self.entries
        doc = self.parse(self.url, self.read_document(self.url))
        if isinstance(doc, dict) and "sets" in doc:
            self.read_list(doc)
        elif isinstance(doc, dict) and _is_stac(doc):
            self.read_stac(doc, self.url)
        else:
            hint = ""
            if isinstance(doc, dict) and ("refs" in doc or "version" in doc or any(
                    str(k).endswith(ZARR_KEYS) for k in doc)):
                hint = " (it looks like one reference set: mount it without -o catalog)"
            raise CatalogError(
                f"{self.url}: not a catalogue: expected a directory of reference sets, a list "
                f"file with \"sets\", or a STAC Collection, ItemCollection or Item{hint}")
        return self.entries

    def _is_directory(self, fs: Any, path: str) -> bool:
        if self.local:
            real = local_path(self.url)
            if os.path.isdir(real):
                return True
            if not os.path.exists(real):
                raise FileNotFoundError(real)
            return False
        if protocol(self.url) in ("http", "https") and not is_chained(self.url):
            return self.url.endswith("/")
        return self.call(fs.info, path).get("type") == "directory"

    def read_directory(self, fs: Any, path: str) -> None:
        if self._is_parquet_dir(fs, self.url):
            raise CatalogError(f"{self.url}: is one Parquet reference set, not a catalogue: "
                               "mount it without -o catalog")
        if self.local:
            root = os.path.abspath(local_path(self.url))
            with os.scandir(root) as it:
                listing = [(e.name, os.path.join(root, e.name), e.is_dir()) for e in it]
        else:
            found = self.call(fs.ls, path, True)
            listing = []
            for info in found:
                full = str(info["name"]).rstrip("/")
                if full.rstrip("/") == path.rstrip("/"):
                    continue  # some stores list the directory itself
                listing.append((posixpath.basename(full), fs.unstrip_protocol(full),
                                info.get("type") == "directory"))
        listing = sorted(e for e in listing if not e[0].startswith("."))
        # directories asked for a .zmetadata: each may be a set, so max_sets bounds them
        directories = [source for _, source, is_dir in listing if is_dir]
        if len(directories) > self.max_sets:
            raise CatalogError(f"{self.url}: more than {self.max_sets:,} directories that "
                               "may be Parquet sets (limit max_sets); raise max_sets or "
                               "split the catalogue")
        parquet = self._parquet_dirs(fs, directories)
        for base, source, is_dir in listing:
            if is_dir:
                if source not in parquet:
                    continue
                name = base
                for suffix in PARQUET_SUFFIXES:
                    if name.endswith(suffix) and len(name) > len(suffix):
                        name = name[: -len(suffix)]
                        break
                self.add(name, source, {}, base + "/")
            else:
                name = json_set_name(base)
                if name is not None:
                    self.add(name, source, {}, base)

    def _parquet_dirs(self, fs: Any, directories: list[str]) -> set[str]:
        """Those of ``directories`` that are Parquet sets. Remote ones are asked ``PROBES`` at a
        time (each is a round trip); the first failure, in listing order, is raised."""
        if self.local or len(directories) < 2:
            return {d for d in directories if self._is_parquet_dir(fs, d)}
        with ThreadPoolExecutor(PROBES, thread_name_prefix="refmount-probe") as pool:
            futures = [pool.submit(self._is_parquet_dir, fs, d) for d in directories]
            try:
                return {d for d, f in zip(directories, futures, strict=True) if f.result()}
            finally:
                for f in futures:
                    f.cancel()

    def _is_parquet_dir(self, fs: Any, source: str) -> bool:
        if self.local:
            return os.path.isfile(os.path.join(local_path(source), ".zmetadata"))
        _, path = url_to_fs(source, **self.options)
        return bool(self.call(fs.isfile, path.rstrip("/") + "/.zmetadata"))

    def parse(self, url: str, data: bytes) -> Any:
        path = url.split("?", 1)[0].split("#", 1)[0]
        base = path[:-len(c) - 1] if (c := _compression_suffix(path)) else path
        try:
            if base.lower().endswith(LIST_SUFFIXES_YAML):
                return _load_yaml(data)
            return orjson.loads(data)
        except orjson.JSONDecodeError as e:
            hint = ""
            if data.lstrip()[:1] == b"<" and not url.endswith("/"):
                hint = "; an HTML page: for a server's directory listing, end the URL with /"
            raise CatalogError(f"{url}: not valid JSON ({str(e).splitlines()[0]}){hint}") \
                from None
        except RecursionError:
            raise CatalogError(f"{url}: nested too deeply") from None
        except CatalogError as e:
            raise CatalogError(f"{url}: {e}") from None

    def read_list(self, doc: dict[str, Any]) -> None:
        sets = doc["sets"]
        if not isinstance(sets, dict):
            raise CatalogError(f"{self.url}: \"sets\" must map names to sources")
        if len(sets) > self.max_sets:
            raise CatalogError(f"{self.url}: more than {self.max_sets:,} reference sets (limit "
                               "max_sets); raise max_sets or split the catalogue")
        for name, value in sets.items():
            where = f"set {name!r}"
            if isinstance(value, str):
                source, options = value, {}
            elif isinstance(value, dict):
                source = value.get("source")
                unknown = sorted(set(value) - {"source", "options"})
                if unknown:
                    raise CatalogError(f"{self.url}: {where}: unknown field {unknown[0]!r} "
                                       "(a set has \"source\" and \"options\")")
                if not isinstance(source, str) or not source:
                    raise CatalogError(f"{self.url}: {where}: \"source\" must be a URL or path")
                options = set_options(value.get("options"), f"{self.url}: {where}")
            else:
                raise CatalogError(f"{self.url}: {where}: expected a source (text) or "
                                   "{\"source\": ..., \"options\": ...}")
            resolved = self.resolve(self.url, source, where)
            if resolved is not None:
                self.add(str(name), resolved, options, where)

    def resolve(self, base: str, href: str, where: str) -> str | None:
        """``href`` of a document at ``base`` as a URL or path; None (with a warning) for a
        local path or URL, or a chained URL, in a remote catalogue (on HTTP, ``/path`` is
        the server's, as in a web page)."""
        if "\x00" in href:
            raise CatalogError(f"{self.url}: {where}: the source contains a NUL character")
        http = protocol(base) in ("http", "https") and not is_chained(base)
        resolved = join_url(base, href)
        if not self.local and (is_local(resolved) or is_chained(resolved)
                               or (href.startswith("/") and not http)):
            log.warning("catalogue %s: skipped %s: a remote catalogue may name only remote "
                        "sets (not local or chained URLs)", redact_url(self.url), where)
            return None
        return resolved

    def read_stac(self, doc: dict[str, Any], url: str) -> None:
        kind = doc.get("type")
        if kind == "Feature":
            self.stac_item(doc, url)
        elif kind == "FeatureCollection":
            features = doc.get("features")
            if not isinstance(features, list):
                raise CatalogError(f"{url}: an ItemCollection's \"features\" must be a list")
            for item in features:
                self.stac_item(item, url)
        else:  # a Collection (or Catalog): its own assets, then its items
            for key, asset in _reference_assets(doc):
                self.stac_asset(str(key), asset, url)
            links = doc.get("links")
            items = [link["href"] for link in links or []
                     if isinstance(link, dict) and link.get("rel") == "item"
                     and isinstance(link.get("href"), str)] if isinstance(links, list) else []
            if len(items) > self.max_sets:
                raise CatalogError(f"{url}: more than {self.max_sets:,} item links (limit "
                                   "max_sets); raise max_sets or split the catalogue")
            for href in items:
                item_url = self.resolve(url, href, f"item link {href!r}")
                if item_url is None:
                    continue
                self.stac_item(self.parse(item_url, self.read_document(item_url)), item_url)

    def stac_item(self, item: Any, url: str) -> None:
        if not isinstance(item, dict) or item.get("type") != "Feature":
            raise CatalogError(f"{url}: a STAC item must be a JSON object with \"type\": "
                               "\"Feature\"")
        item_id = item.get("id")
        if not isinstance(item_id, str):
            raise CatalogError(f"{url}: a STAC item without an \"id\"")
        assets = list(_reference_assets(item))
        for key, asset in assets:
            name = item_id if len(assets) == 1 else f"{item_id}.{key}"
            self.stac_asset(name, asset, url, f"item {item_id!r} asset {key!r}")

    def stac_asset(self, name: str, asset: dict[str, Any], url: str,
                   where: str | None = None) -> None:
        where = where or f"asset {name!r}"
        href = asset["href"]
        resolved = self.resolve(url, href, where)
        if resolved is None:
            return
        options = set_options(_stac_options(asset), f"{self.url}: {where}")
        self.add(name, resolved, options, where)


def json_set_name(base: str) -> str | None:
    """The set name of a file named ``base`` in a catalogue directory, or None when it is not
    a JSON reference set (``a.json`` -> ``a``; ``a.json.gz`` -> ``a``)."""
    if base[-5:].lower() == ".json":  # the common case, without asking fsspec
        return base[:-5] if len(base) > 5 else None
    compression = _compression_suffix(base)
    stem = base[: -len(compression) - 1] if compression else base
    if stem.lower().endswith(".json") and len(stem) > len(".json"):
        return stem[: -len(".json")]
    return None


def _compression_suffix(name: str) -> str | None:
    """The extension by which fsspec (``compression="infer"``, as SOURCE is opened) reads
    ``name`` compressed, or None."""
    if infer_compression(name) is None:
        return None
    return name.rsplit(".", 1)[-1]


def join_url(base: str, href: str) -> str:
    """``href`` as found in a document at ``base``: absolute URLs and paths as they are,
    relative ones against ``base``'s directory."""
    if "://" in href or is_chained(href) or href.startswith("~"):
        return href
    if is_local(base):
        if os.path.isabs(href):
            return href
        base_path = local_path(base)
        joined = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(base_path)), href))
        return joined if base_path == base else f"{base.split('://', 1)[0]}://{joined}"
    if protocol(base) in ("http", "https") and not is_chained(base):
        return urllib.parse.urljoin(base, href)
    head, sep, rest = base.partition("://")
    directory = posixpath.dirname(rest)
    return f"{head}{sep}{posixpath.normpath(posixpath.join(directory, href))}"


def set_options(value: Any, where: str) -> dict[str, str]:
    """A set's options from a list file or STAC asset: ``"decode,timeout=30"`` or
    ``{"decode": true, "timeout": 30}``, validated, as name -> ``-o`` value ("" for a flag)."""
    if value is None:
        return {}
    pairs: list[tuple[str, Any, bool]] = []  # name, value, whether a value was written
    if isinstance(value, str):
        for item in split_options(value):
            name, sep, text = item.partition("=")
            pairs.append((name.strip(), text, bool(sep)))
    elif isinstance(value, dict):
        pairs = [(str(k), v, True) for k, v in value.items()]
    else:
        raise CatalogError(f"{where}: \"options\" must be text (\"decode,timeout=30\") or an "
                           "object")
    out: dict[str, str] = {}
    for name, raw, written in pairs:
        option = OPTIONS_BY_NAME.get(name)
        if option is None:
            raise CatalogError(f"{where}: unknown option {name!r}"
                               f"{did_you_mean(name, PER_SET_OPTIONS)}")
        if name not in PER_SET_OPTIONS:
            raise CatalogError(f"{where}: option {name!r} applies to the whole mount, not to one "
                               f"set (a set may have {', '.join(sorted(PER_SET_OPTIONS))})")
        if isinstance(option.kind, Flag):
            if raw is True or (not written):
                out[name] = ""
                continue
            if raw is False:
                continue
            raise CatalogError(f"{where}: option {name!r} takes no value (true or false in an "
                               "object)")
        if not written:
            raise CatalogError(f"{where}: option {name!r} needs a value ({option.spec})")
        if isinstance(raw, bool) or raw is None:
            raise CatalogError(f"{where}: option {name!r} needs a value ({option.spec})")
        if isinstance(option.kind, Json):
            if isinstance(raw, dict):
                text = json.dumps(raw)
            elif isinstance(raw, str) and not raw.startswith("@"):
                text = raw
            else:  # @FILE would read a file the catalogue names: refused
                raise CatalogError(f"{where}: option {name!r} must be a JSON object given "
                                   "inline in a catalogue")
        elif isinstance(raw, (str, int, float)):
            text = str(raw)
        else:
            raise CatalogError(f"{where}: option {name!r} must be text or a number")
        try:
            option.kind.parse(name, text)
        except ConfigError as e:
            raise CatalogError(f"{where}: {e}") from None
        out[name] = text
    return out


YAML_TRUE = frozenset({"true", "yes", "on"})
YAML_FALSE = frozenset({"false", "no", "off"})
YAML_NULL = frozenset({"", "~", "null"})


def _load_yaml(data: bytes) -> Any:
    """One YAML document, built from libyaml's events (PyYAML's resolver and constructor take
    seconds a megabyte): mappings, sequences and scalars, a plain scalar ``true``/``yes``/
    ``on`` (``false``/``no``/``off``, ``null``/``~``/empty) read as a boolean (None), every other
    scalar as text (options are text anyway). Tags are ignored; aliases (a YAML bomb repeats a
    subtree through them), nesting deeper than MAX_NESTING, keys that are not scalars and a
    second document are refused."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    stack: list[tuple[Any, Any]] = []  # (container, pending mapping key or _NO_KEY)
    root: list[Any] = []
    documents = 0

    def put(value: Any) -> None:
        if not stack:
            root.append(value)
            return
        container, key = stack[-1]
        if isinstance(container, list):
            container.append(value)
        elif key is _NO_KEY:
            if isinstance(value, (dict, list)):
                raise CatalogError("a YAML mapping key must be a scalar")
            stack[-1] = (container, "" if value is None else str(value))
        else:
            container[key] = value
            stack[-1] = (container, _NO_KEY)

    try:
        for event in yaml.parse(data, Loader=loader):
            if isinstance(event, yaml.ScalarEvent):
                value: Any = event.value
                if event.implicit[0] and not event.style:  # plain (libyaml: "", PyYAML: None)
                    low = value.lower()
                    value = (True if low in YAML_TRUE else False if low in YAML_FALSE
                             else None if low in YAML_NULL else value)
                put(value)
            elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= MAX_NESTING:
                    raise CatalogError(f"nested deeper than {MAX_NESTING} levels (line "
                                       f"{event.start_mark.line + 1})")
                container: Any = {} if isinstance(event, yaml.MappingStartEvent) else []
                put(container)
                stack.append((container, _NO_KEY))
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                stack.pop()
            elif isinstance(event, yaml.AliasEvent):
                raise CatalogError(f"YAML aliases are not allowed in a catalogue (line "
                                   f"{event.start_mark.line + 1})")
            elif isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise CatalogError("more than one YAML document")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise CatalogError(f"not valid YAML{where}") from None
    return root[0] if root else None


_NO_KEY = object()  # a mapping waiting for its next key


def _is_stac(doc: dict[str, Any]) -> bool:
    return doc.get("type") in ("Feature", "FeatureCollection", "Collection", "Catalog") and (
        "stac_version" in doc or doc.get("type") == "FeatureCollection")


def _reference_assets(obj: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any]]]:
    """The assets of a STAC object that are kerchunk reference sets, by key."""
    assets = obj.get("assets")
    if not isinstance(assets, dict):
        return
    for key, asset in assets.items():
        if not isinstance(asset, dict) or not isinstance(asset.get("href"), str):
            continue
        roles = asset.get("roles")
        roles = set(roles) if isinstance(roles, list) and all(
            isinstance(r, str) for r in roles) else set()
        media = str(asset.get("type") or "").partition(";")[0].strip().lower()
        if roles & STAC_REFERENCE_ROLES and media in STAC_JSON_TYPES | STAC_PARQUET_TYPES:
            yield str(key), asset


def _stac_options(asset: dict[str, Any]) -> dict[str, Any]:
    """Set options from an asset's ``xarray:storage_options`` and ``xarray:open_kwargs``
    (``storage_options``, ``backend_kwargs.storage_options``): the reference file system's
    ``remote_protocol``, ``remote_options`` and ``target_options``."""
    found: list[Any] = [asset.get("xarray:storage_options")]
    kwargs = asset.get("xarray:open_kwargs")
    if isinstance(kwargs, dict):
        found.append(kwargs.get("storage_options"))
        backend = kwargs.get("backend_kwargs")
        if isinstance(backend, dict):
            found.append(backend.get("storage_options"))
    out: dict[str, Any] = {}
    for so in found:
        if isinstance(so, dict):
            for name in ("remote_protocol", "remote_options", "target_options"):
                if so.get(name) is not None:
                    out[name] = so[name]
    return out


# --- the identity of a set ---------------------------------------------------------------------

DIGEST_BYTES = 64 << 20  # read of a file whose storage gives no stamp, to tell a change
# What a storage's ``info`` may say that changes with the content (besides the size).
STAMPS = ("mtime", "ETag", "etag", "Last-Modified", "LastModified", "last_modified", "md5",
          "Content-MD5", "Digest", "generation", "VersionId", "version_id", "created", "ino")


def source_identity(source: str, storage_options: dict[str, Any], *, timeout: float) -> str:
    """A short string that changes when the reference set at ``source`` changes: the size
    and modification stamp (mtime, ETag, Last-Modified, version) of its file; for a Parquet
    reference directory, of its ``.zmetadata`` and of the listing of its record files. A file
    whose storage gives no stamp (an HTTP server without ``ETag`` or ``Last-Modified``) is
    known by the digest of its first DIGEST_BYTES.
    OSError (FileNotFoundError when it is gone) or CatalogError when it cannot be read."""
    try:
        if is_local(source):
            parts = _local_identity(local_path(source))
        else:
            parts = within(timeout, redact_url(source), _remote_identity, source,
                           dict(storage_options))
    except SourceTimeout as e:
        raise CatalogError(str(e)) from None
    except (OSError, CatalogError):
        raise
    except Exception as e:  # a backend's own errors (bad URL, missing module, ...)
        raise CatalogError(redact_url(f"{source}: cannot tell whether it changed "
                                      f"({type(e).__name__}: {e})").splitlines()[0]) from None
    blob = json.dumps(parts, sort_keys=True, default=str).encode()
    return hashlib.sha256(blob).hexdigest()[:24]


def _local_stamp(st: os.stat_result) -> list[int]:
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_dev]


def _local_identity(path: str) -> list[Any]:
    if path.endswith("/.zmetadata"):
        path = path[: -len("/.zmetadata")]
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        return ["file", _local_stamp(st)]
    meta = os.stat(os.path.join(path, ".zmetadata"))
    records = []
    for directory, dirs, files in os.walk(path):
        dirs.sort()
        for name in sorted(files):
            if name.startswith(".") and directory == path:
                continue
            full = os.path.join(directory, name)
            try:
                records.append([os.path.relpath(full, path), _local_stamp(os.stat(full))])
            except FileNotFoundError:
                continue  # removed while listed: the next identity sees it gone
    return ["parquet", _local_stamp(meta), records]


def _remote_identity(source: str, options: dict[str, Any]) -> list[Any]:
    fs, path = url_to_fs(source, **options)
    path = path.rstrip("/")
    if path.endswith("/.zmetadata"):
        path = path[: -len("/.zmetadata")]
    fs.invalidate_cache(path)  # a listing cached by the file system would hide a change
    meta: dict[str, Any] | None = None
    if json_set_name(posixpath.basename(path)) is None:
        # Not named as a JSON set: a Parquet directory? (An HTTP "directory" has no info of
        # its own, or an HTML listing's: its .zmetadata says.)
        try:
            meta = fs.info(path + "/.zmetadata")
        except FileNotFoundError:
            meta = None
    if meta is None:
        info = fs.info(path)
        stamp = _stamp(info)
        if set(stamp) <= {"size"}:  # no stamp at all (an HTTP server without validators)
            stamp["sha256"] = _content_digest(fs, path)
        return ["file", stamp]
    records: list[Any] = []
    # HTTP has no listing (a server's HTML index, where there is one, is not a contract):
    # there, the set is known by its .zmetadata alone.
    http = protocol(source) in ("http", "https") and not is_chained(source)
    found = {} if http else fs.find(path, detail=True)
    for name, rinfo in sorted(found.items()):
        rel = name[len(path):].lstrip("/")
        if rel == ".zmetadata":
            continue
        records.append([rel, _stamp(rinfo)])
    return ["parquet", _stamp(meta), records]


def _content_digest(fs: Any, path: str) -> str:
    """The digest of the file's first DIGEST_BYTES (for storage that gives no stamp)."""
    digest = hashlib.sha256()
    with fs.open(path, "rb", block_size=0) if fs.protocol[0] in ("http", "https") \
            else fs.open(path, "rb") as f:
        left = DIGEST_BYTES
        while left > 0 and (piece := f.read(min(left, 1 << 20))):
            digest.update(piece)
            left -= len(piece)
    return digest.hexdigest()


def _stamp(info: dict[str, Any]) -> dict[str, str]:
    return {k: str(info[k]) for k in ("size", *STAMPS) if info.get(k) is not None}

