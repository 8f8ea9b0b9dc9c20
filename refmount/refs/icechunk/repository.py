"""An Icechunk repository read from storage through fsspec: refs, config, snapshots, manifests.

A synchronous API (the daemon calls it in worker threads). Format version 1 (icechunk 1.x:
``refs/branch.NAME/ref.json``, ``config.yaml``) and version 2 (icechunk 2.x: the ``repo``
object) alike. Every object is read under :class:`~refmount.refs.limits.Limits` (its size
within ``max_source``, its decompression within ``max_ratio``, every storage call within
``source_timeout``), every flatbuffer verified before it is read (verify.py); anything
malformed is an :class:`IcechunkError` whose text is one line.

Opening looks at the layout; for version 2 it reads the repo info object (branches, tags,
snapshots and config as of that moment: open the repository again to see later commits),
while version 1's ``refs/`` files are read each time a ref is asked for. A snapshot's nodes
are read when it is asked for; a manifest when a chunk it covers is, kept in an LRU bounded
by bytes (``manifest_cache_bytes``).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from refmount.base.lru import LRU
from refmount.base.redact import redact_url
from refmount.base.urls import is_local
from refmount.refs.icechunk import header, ids
from refmount.refs.icechunk.config import MAX_CONFIG, Declared, containers_from_yaml
from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.icechunk.manifest import Manifest
from refmount.refs.icechunk.records import ChunkRef, Node, SnapshotInfo
from refmount.refs.icechunk.refsfile import (
    MAX_REF_JSON,
    RepoInfo,
    parse_ref_json,
    parse_repo_info,
    ref_name_ok,
)
from refmount.refs.icechunk.snapshot import Snapshot
from refmount.refs.icechunk.storage import ROOTED, Storage, is_repository, rooted_layout
from refmount.refs.limits import DEFAULT_LIMITS, Limits

__all__ = ["ChunkRef", "IcechunkError", "Node", "Repository", "Snapshot", "SnapshotInfo"]

MANIFEST_CACHE_BYTES = 256 << 20
KNOWN_SHOWN = 10  # branches, and tags, a message about a missing one names
_CROCKFORD_ALIASES = str.maketrans("ILO", "110")  # Crockford's decoding of look-alikes
UNLIMITED = 1 << 62


class Repository:
    format_version: int  # 1 or 2
    root: str  # the repository URL as opened

    def __init__(self, storage: Storage, url: str, limits: Limits, format_version: int,
                 info: RepoInfo | None, manifest_cache_bytes: int) -> None:
        self._storage = storage
        self.root = url
        self.limits = limits
        self.format_version = format_version
        self._info = info
        self._lock = threading.Lock()
        self._manifests: LRU[str, Manifest] = LRU(max_weight=manifest_cache_bytes,
                                                   weigh=lambda m: m.nbytes, keep_newest=True)
        self._containers: Declared | None = info.containers if info is not None else None
        self._shown_root = redact_url(url)

    @property
    def max_object(self) -> int:
        return self.limits.max_source or UNLIMITED

    @classmethod
    def open(cls, url: str, storage_options: Mapping[str, Any], limits: Limits = DEFAULT_LIMITS,
             *, manifest_cache_bytes: int = MANIFEST_CACHE_BYTES) -> Repository:
        """The repository at ``url``: version 2 if it has a ``repo`` object, else version 1 if
        it has a ``refs/`` branch main or a ``config.yaml``; IcechunkError otherwise."""
        storage = Storage(url, storage_options, limits.source_timeout, limits.source_roots)
        max_object = limits.max_source or UNLIMITED
        if storage.exists("repo"):
            data = storage.read("repo", max_object)
            name = storage.shown("repo")
            _, body = header.payload(data, name, header.REPO_INFO, max_object, limits.max_ratio)
            info = parse_repo_info(body, name, limits.max_keys)
            return cls(storage, url, limits, 2, info, manifest_cache_bytes)
        if storage.exists("refs/branch.main/ref.json") or storage.exists("config.yaml"):
            return cls(storage, url, limits, 1, None, manifest_cache_bytes)
        if not is_local(url):
            if rooted_layout(storage):
                raise IcechunkError(f"{redact_url(url)}: {ROOTED}")
            storage.head("repo", 1)  # remote storage answers "no" to exists() when it cannot be
            # reached at all: this read names the failure (unknown host, refused, timeout)
        raise IcechunkError(f"{redact_url(url)}: not an Icechunk repository (no repo object, no "
                            "refs/branch.main)")

    @staticmethod
    def detect(url: str, storage_options: Mapping[str, Any], timeout: float | None = 30.0,
               roots: tuple[str, ...] | None = None) -> bool:
        """Whether ``url`` looks like an Icechunk repository (``storage.is_repository``)."""
        return is_repository(url, storage_options, timeout, roots)

    # ---- refs

    def _list_refs(self, prefix: str) -> dict[str, str]:
        names = self._storage.listdir("refs", self.limits.max_keys)
        if names is None:  # storage without listings: the main branch is all that can be known
            if prefix == "branch.":
                return {"main": self._read_ref("branch.main")}
            return {}
        out = {}
        for entry in sorted(names):
            if not entry.startswith(prefix) or not ref_name_ok(entry[len(prefix):]):
                continue
            ref = entry[len(prefix):]
            if prefix == "tag." and self._storage.exists(f"refs/{entry}/ref.json.deleted"):
                continue
            if not self._storage.exists(f"refs/{entry}/ref.json"):
                continue
            out[ref] = self._read_ref(entry)
        return out

    def _names(self, prefix: str) -> list[str] | None:
        """The names of the branches (``branch.``) or tags (``tag.``), deleted tags included,
        without reading them; None when the storage cannot list."""
        if self._info is not None:
            return list(self._info.branches if prefix == "branch." else self._info.tags)
        names = self._storage.listdir("refs", self.limits.max_keys)
        if names is None:
            return None
        return [e[len(prefix):] for e in names if e.startswith(prefix) and ref_name_ok(e[len(prefix):])]

    def _read_ref(self, entry: str) -> str:
        rel = f"refs/{entry}/ref.json"
        return parse_ref_json(self._storage.read(rel, MAX_REF_JSON), self._storage.shown(rel))

    def branches(self) -> dict[str, str]:
        """Branch name -> snapshot id."""
        if self._info is not None:
            return dict(self._info.branches)
        return self._list_refs("branch.")

    def tags(self) -> dict[str, str]:
        """Tag name -> snapshot id (deleted tags left out)."""
        if self._info is not None:
            return dict(self._info.tags)
        return self._list_refs("tag.")

    def resolve(self, *, branch: str | None = None, tag: str | None = None,
                snapshot: str | None = None) -> str:
        """The snapshot id a branch, a tag or a snapshot id names (default: branch main). A
        snapshot id is Crockford base 32, read case-insensitively (``i``/``l`` as ``1``, ``o``
        as ``0``); a branch or tag name is checked (``refsfile.ref_name_ok``) before any
        storage is asked; one that does not exist is named with the branches and tags that do."""
        if sum(x is not None for x in (branch, tag, snapshot)) > 1:
            raise IcechunkError("name one of branch, tag and snapshot")
        if snapshot is not None:
            wanted = snapshot.strip().upper().translate(_CROCKFORD_ALIASES)
            if not ids.is_id12(wanted):
                raise IcechunkError(f"{snapshot[:64]!r}: not a snapshot id (20 characters of Crockford "
                                    "base 32)")
            if self._info is not None and wanted not in self._info.snapshots:
                raise IcechunkError(f"{self._shown_root}: no snapshot {wanted}")
            return wanted
        kind, ref = ("tag", tag) if tag is not None else ("branch", branch or "main")
        if not ref_name_ok(ref):
            raise IcechunkError(f"{ref[:64]!r}: not a {kind} name (a name has no '/', '..' or "
                                "control character, also once percent-escapes are decoded)")
        if self._info is not None:
            if kind == "tag" and ref in self._info.deleted_tags:
                raise IcechunkError(f"{self._shown_root}: the tag {ref!r} was deleted")
            found = (self._info.tags if kind == "tag" else self._info.branches).get(ref)
            if found is None:
                raise IcechunkError(f"{self._shown_root}: no {kind} {ref!r}{self._known(kind, ref)}")
            return found
        entry = f"{kind}.{ref}"
        if kind == "tag" and self._storage.exists(f"refs/{entry}/ref.json.deleted"):
            raise IcechunkError(f"{self._shown_root}: the tag {ref!r} was deleted")
        if not self._storage.exists(f"refs/{entry}/ref.json"):
            raise IcechunkError(f"{self._shown_root}: no {kind} {ref!r}{self._known(kind, ref)}")
        return self._read_ref(entry)

    def _known(self, kind: str, ref: str) -> str:
        """What a message about a missing branch or tag adds: ``did you mean`` the other kind
        of that name, and the branches and tags there are (at most KNOWN_SHOWN of each)."""
        try:
            refs = {"branch": self._names("branch."), "tag": self._names("tag.") or []}
        except (IcechunkError, OSError):  # a listing that fails: the message stays as it is
            return ""
        if refs["branch"] is None:  # storage without listings (plain HTTP)
            return ""
        other = "tag" if kind == "branch" else "branch"
        hint = f"; did you mean {other}={ref}?" if ref in (refs[other] or []) else ""
        parts = []
        for k in ("branch", "tag"):
            names = sorted(refs[k] or [])
            shown_names: list[str] = []
            checked = 0
            for n in names:  # a version 1 deleted tag is a directory too: left out
                if len(shown_names) == KNOWN_SHOWN or checked == 3 * KNOWN_SHOWN:
                    break
                checked += 1
                if k == "branch" or self._info is not None or not self._storage.exists(
                        f"refs/tag.{n}/ref.json.deleted"):
                    shown_names.append(n)
            if not shown_names:
                parts.append(f"no {k}es" if k == "branch" else "no tags")
                continue
            left = len(names) - checked
            more = f" and {left:,} more" if left else ""
            shown = ", ".join(repr(n[:64]) for n in shown_names)
            parts.append(f"{k}es {shown}{more}" if k == "branch" else f"tags {shown}{more}")
        return f"{hint} ({'; '.join(parts)})"

    # ---- objects

    def snapshot(self, snapshot_id: str) -> Snapshot:
        if not ids.is_id12(snapshot_id):
            raise IcechunkError(f"{snapshot_id[:64]!r}: not a snapshot id")
        rel = f"snapshots/{snapshot_id}"
        name = self._storage.shown(rel)
        data = self._storage.read(rel, self.max_object)
        hdr, body = header.payload(data, name, header.SNAPSHOT, self.max_object, self.limits.max_ratio)
        if hdr.spec_version > self.format_version:
            raise IcechunkError(f"{name}: a spec version {hdr.spec_version} snapshot in a version "
                                f"{self.format_version} repository")
        info = self._info.snapshots.get(snapshot_id) if self._info is not None else None
        return Snapshot(body, name, snapshot_id, self.limits, self._manifest, info)

    def _manifest(self, manifest_id: str) -> Manifest:
        with self._lock:
            found = self._manifests.get(manifest_id)
        if found is not None:
            return found
        rel = f"manifests/{manifest_id}"
        name = self._storage.shown(rel)
        data = self._storage.read(rel, self.max_object)
        _, body = header.payload(data, name, header.MANIFEST, self.max_object, self.limits.max_ratio)
        del data
        manifest = Manifest(body, name, manifest_id, self.limits.max_key_length, self.limits.max_keys,
                            max_inline=self.limits.max_inline, max_inline_total=self.max_object)
        with self._lock:
            self._manifests.put(manifest_id, manifest)
        return manifest

    def _declared(self) -> Declared:
        if self._containers is None:
            if self._storage.exists("config.yaml"):
                text = self._storage.read("config.yaml", MAX_CONFIG)
                self._containers = containers_from_yaml(text, self._storage.shown("config.yaml"))
            else:
                self._containers = Declared()
        return self._containers

    def virtual_chunk_containers(self) -> list[str]:
        """The URL prefixes of the virtual chunk containers the repository's config declares."""
        return list(self._declared().prefixes)

    def virtual_chunk_container_names(self) -> dict[str, str]:
        """Name -> URL prefix of the named virtual chunk containers (``vcc://NAME/...``)."""
        return dict(self._declared().names)

    def object_url(self, location: str) -> str:
        """The absolute URL of a native chunk's object (``location`` as a ChunkRef gives it)."""
        return self._storage.url_of(location)
