"""Catalogues: many reference sets named by one SOURCE, read into entries (name, SOURCE, options).

A catalogue (``-o catalog``) is one of three forms, told apart by what CATALOG is:

1. **a directory of reference sets** (local or any fsspec URL that lists; an HTTP listing
   URL ends with ``/``): every JSON set (``.json``, or ``.json`` + a compression suffix
   fsspec infers: ``.gz``, ``.bz2``, ``.xz``, ``.lzma``, ``.zst``, ``.zip``) and every Parquet
   reference directory (one holding ``.zmetadata``) and every Icechunk repository (one
   holding ``repo`` or ``refs/branch.main/ref.json``) directly inside it. A set's name is its
   entry's name without those suffixes (``era5.json.gz`` -> ``era5``, ``run.parq/`` ->
   ``run``; ``.parq``, ``.parquet`` and ``.icechunk`` are stripped from a directory). Hidden
   entries and anything else are ignored;
2. **a list file** (JSON, or YAML for ``.yaml``/``.yml``): ``{"sets": {NAME: SOURCE | {"source":
   SOURCE, "options": "decode,timeout=30" | {"decode": true, ...}}}}``; a relative SOURCE is
   relative to the list file's directory;
3. **a STAC Collection, ItemCollection or Item** (JSON): one set per asset that is a kerchunk
   reference file (roles ``references`` or ``index`` with a JSON or Parquet media type), named
   by its item's id (``ID.ASSET`` when an item has several such assets; a Collection's own
   assets by their key); a Collection's ``item`` links are followed.

Each entry's ``options`` are ``-o`` options for that set only (``setoptions.PER_SET_OPTIONS``),
validated against ``config.OPTIONS``; ``CatalogEntry.option_args`` renders them for
``config.apply_options``. Names are checked (:func:`name_problem`): an entry with a name that
cannot be a directory is skipped with a warning. Two entries with one name are an error.

Everything here is synchronous (the daemon calls it in a worker thread) and bounded:
``max_sets`` entries, ``max_bytes`` read from list and STAC documents (all of them together),
``timeout`` for each remote call. Bad input raises ``CatalogError`` (``base/errors.py``), one line.

The parts are modules of their own: a YAML list file's parser (``sets/catalogyaml.py``), STAC's
assets (``sets/stac.py``), the per-set options (``sets/setoptions.py``); a set's identity, which
tells that it changed, is ``sets/setidentity.py``.
"""

from __future__ import annotations

import logging
import os
import posixpath
import re
import urllib.parse
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import orjson
from fsspec.core import url_to_fs
from fsspec.utils import infer_compression

from refmount.base.errors import CatalogError, ConfigError
from refmount.base.redact import redact_url
from refmount.base.urls import is_chained, is_local, local_path, protocol
from refmount.config import OPTIONS_BY_NAME, Flag
from refmount.refs.deadline import within
from refmount.refs.model import ReferenceSetError
from refmount.refs.source import open_source
from refmount.sets.catalogyaml import load_yaml
from refmount.sets.setoptions import set_options
from refmount.sets.stac import is_stac, reference_assets, stac_options

log = logging.getLogger(__name__)

T = TypeVar("T")

PARQUET_SUFFIXES = (".parquet", ".parq", ".icechunk")  # stripped from a set directory's name
# a directory that is a set holds one of these (a Parquet set; an Icechunk repository)
SET_DIRECTORY_MARKS = (".zmetadata", "repo", "refs/branch.main/ref.json")
LIST_SUFFIXES_YAML = (".yaml", ".yml")
MAX_NAME_BYTES = 255
ZARR_KEYS = (".zgroup", ".zattrs", ".zarray", ".zmetadata")  # a reference set's, not a catalogue's
PROBES = 16  # remote directories of a catalogue asked at once whether they are Parquet sets
_CONTROL = re.compile("[\x00-\x1f\x7f]")


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
        elif isinstance(doc, dict) and is_stac(doc):
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
        """Whether directory ``source`` is a set: a Parquet set or an Icechunk repository."""
        if self.local:
            return any(os.path.isfile(os.path.join(local_path(source), mark))
                       for mark in SET_DIRECTORY_MARKS)
        _, path = url_to_fs(source, **self.options)
        return any(bool(self.call(fs.isfile, path.rstrip("/") + "/" + mark))
                   for mark in SET_DIRECTORY_MARKS)

    def parse(self, url: str, data: bytes) -> Any:
        path = url.split("?", 1)[0].split("#", 1)[0]
        base = path[:-len(c) - 1] if (c := _compression_suffix(path)) else path
        try:
            if base.lower().endswith(LIST_SUFFIXES_YAML):
                return load_yaml(data)
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
            for key, asset in reference_assets(doc):
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
        assets = list(reference_assets(item))
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
        options = set_options(stac_options(asset), f"{self.url}: {where}")
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
