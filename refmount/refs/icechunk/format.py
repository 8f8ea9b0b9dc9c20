"""Icechunk repositories as a reference-set format: this format's entry in the registry.

``prepare`` (in the foreground) opens the repository, resolves ``-o branch=``/``tag=``/
``snapshot=`` (default: branch ``main``) to one snapshot and checks its nodes; the snapshot's
id travels to the daemon in the ``IndexFile`` (``revision``), so the daemon serves exactly the
snapshot the CLI resolved. ``open_tree`` serves that snapshot through an ``IcechunkTree``
(tree.py): every node's ``zarr.json``, and the chunk keys of each array, listed lazily from
the manifests.

Chunks become references: an inline one its bytes, a native one a range of the repository's
object (``Repository.object_url``: read with SOURCE's storage options, ``OpenedTree.own_objects``),
a virtual one a range of its URL, read only when the URL lies under a virtual chunk container
the repository declares **and** the mount authorises (``access``, from the target rules). A
relative location (``vcc://NAME/path``, locations.py) is first made the URL its named
container's prefix gives it, then treated as any other virtual chunk's URL.
"""

from __future__ import annotations

import bisect
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING

from refmount.base.redact import redact_url
from refmount.base.urls import climbs, is_local, local_path, normal_url
from refmount.refs.format import Access, Format, IndexFile, OpenedTree, Options
from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.icechunk.keys import ChunkKeys, UnsupportedArray
from refmount.refs.icechunk.locations import UnknownContainer, absolute
from refmount.refs.icechunk.storage import is_repository
from refmount.refs.limits import DEFAULT_LIMITS, Limits
from refmount.refs.model import FILE_SUFFIXES, Ref, RefKind

if TYPE_CHECKING:
    # The readers (flatbuffers, numpy, yaml) and the tree (numpy, trio) are imported where a
    # repository is opened: detecting that SOURCE is not one, the CLI's first step for every
    # other format, loads none of them.
    from refmount.refs.icechunk.repository import ChunkRef, Node, Repository, Snapshot
    from refmount.refs.icechunk.tree import ArrayKeys
    from refmount.refs.index import KeyIndex

log = logging.getLogger(__name__)

REVISION_KINDS = ("branch", "tag", "snapshot")


def revision_choice(revision: Mapping[str, str] | None) -> dict[str, str]:
    """The one of branch, tag or snapshot asked for (default: branch ``main``); IcechunkError
    when more than one is given."""
    given = {k: v for k, v in (revision or {}).items() if v}
    unknown = set(given) - set(REVISION_KINDS)
    if unknown:
        raise IcechunkError(f"unknown revision option {sorted(unknown)[0]!r}")
    if len(given) > 1:
        names = " and ".join(f"{k}=" for k in REVISION_KINDS if k in given)
        raise IcechunkError(f"give one of branch=, tag=, snapshot= (not {names})")
    return given or {"branch": "main"}


def metadata_keys(snapshot: Snapshot, bad_keys: str, limits: Limits) -> tuple[KeyIndex, list[ArrayKeys]]:
    """The snapshot's ``zarr.json`` keys as a KeyIndex, and its arrays whose chunk keys are
    served (an array whose grid or key encoding is not is served as its ``zarr.json`` only,
    with a warning)."""
    from refmount.refs.icechunk.tree import ArrayKeys
    from refmount.refs.index import KeyIndex
    from refmount.refs.indexbuilder import IndexBuilder

    builder = IndexBuilder(bad_keys, limits)
    inside = nodes_inside_arrays(snapshot.nodes)
    if inside:
        (child, array), n = next(iter(inside.items())), len(inside)
        what = (f"node /{child} lies inside the array /{array} (an array has no children: its "
                "zarr.json would clash with the array's chunk keys)")
        if bad_keys == "error":
            raise IcechunkError(f"{what}: the repository is refused (-o bad_keys=skip leaves such "
                                "nodes out)")
        log.warning("%s%s: left out (bad_keys=skip)", what,
                    f", and {n - 1:,} more nodes inside arrays" if n > 1 else "")
    for node in snapshot.nodes:
        if node.path in inside:
            continue
        builder.add_inline(f"{node.path}/zarr.json" if node.path else "zarr.json", node.zarr_json)
    index = KeyIndex(builder.finish())
    skipped = set(builder.skipped)
    arrays = []
    for node in snapshot.nodes:
        key = f"{node.path}/zarr.json" if node.path else "zarr.json"
        if node.kind != "array" or key in skipped or node.path in inside:
            continue
        try:
            keys = ChunkKeys.from_zarr_json(node.zarr_json)
        except (UnsupportedArray, ValueError) as e:
            log.warning("array /%s: its chunks are not served: %s", node.path, e)
            continue
        arrays.append(ArrayKeys(node.path, keys))
    return index, arrays


def nodes_inside_arrays(nodes: list[Node]) -> dict[str, str]:
    """Path of each node that lies inside an array -> that array's path (``nodes`` sorted by
    path, as a Snapshot holds them: an array's descendants follow it, contiguous)."""
    paths = [n.path for n in nodes]
    out: dict[str, str] = {}
    for node in nodes:
        if node.kind != "array":
            continue
        prefix = f"{node.path}/" if node.path else ""
        i = bisect.bisect_left(paths, prefix)
        while i < len(paths) and paths[i].startswith(prefix):
            if paths[i] != node.path and paths[i] not in out:
                out[paths[i]] = node.path
            i += 1
    return out


def _covers(prefix: str, url: str) -> bool:
    """Whether ``url`` lies under the container ``prefix`` (on a path-segment boundary, and
    without a ``..`` segment after it)."""
    if is_local(prefix) != is_local(url):
        return False
    if is_local(url):
        p, u = local_path(prefix), local_path(url)
    else:
        p, u = normal_url(prefix), normal_url(url)
    if not p:
        return False
    if p.endswith("/"):
        rest = u[len(p):] if u.startswith(p) else None
    else:
        rest = u[len(p) + 1:] if u.startswith(p + "/") else ("" if u == p else None)
    return rest is not None and not climbs(rest) and ".." not in rest.split("/")


def authorisation(container: str) -> str:
    """The option that authorises a virtual chunk container: ``allow_local`` naming its
    directory for a local one (a targets rule alone is not enough where local files are
    confined: ``refmount serve``, ``allow_other``), else a targets rule with its prefix."""
    if is_local(container):
        return f"-o allow_local={os.path.normpath(local_path(container))}"
    shown = redact_url(container)
    return f"-o targets='[{{\"prefix\": \"{shown}\"}}]'"


class ChunkRefs:
    """A snapshot's ChunkRefs made references (see the module's docstring): ``access`` says
    why a virtual chunk's URL may not be read, and takes the version its reference recorded
    (its pin)."""

    def __init__(self, repo: Repository, access: Access | None) -> None:
        self.repo = repo
        self.containers = list(repo.virtual_chunk_containers())
        self.names = repo.virtual_chunk_container_names()
        self.access = access
        if access is not None:
            access.declare(self.containers)

    def absolute(self, location: str) -> str:
        """The URL of a virtual chunk's location (a relative one resolved against its named
        container); UnknownContainer when it names a container the repository does not."""
        return absolute(location, self.names)

    def unknown(self, name: str) -> str:
        known = ", ".join(sorted(self.names)) or "none"
        return (f"a relative virtual chunk location naming container {name!r}, which the "
                f"repository does not declare (its named containers: {known})")

    def container(self, url: str) -> str | None:
        covering = [p for p in self.containers if _covers(p, url)]
        return max(covering, key=len) if covering else None

    def refusal(self, url: str) -> str | None:
        container = self.container(url)
        if container is None:
            return "a virtual chunk outside every virtual chunk container the repository declares"
        reason = self.access.problem(url) if self.access is not None else "nothing authorises it"
        if reason:
            return (f"virtual chunk container {redact_url(container)} is not authorised ({reason}): "
                    f"authorise it with {authorisation(container)}")
        return None

    def unauthorised(self) -> list[str]:
        """The declared containers the mount does not authorise (as a whole), each with the
        option that would: what the warning at start names."""
        out = []
        for container in self.containers:
            access = self.access
            reason = access.problem(container) if access is not None else "nothing authorises it"
            if reason:
                how = authorisation(container)
                out.append(f"{redact_url(container)} ({reason}): authorise it with {how}")
        return out

    def __call__(self, chunk: ChunkRef) -> Ref:
        if chunk.kind == "inline":
            data = chunk.data or b""
            return Ref(RefKind.INLINE, None, 0, len(data), data)
        if chunk.kind == "native":
            return Ref(RefKind.RANGE, self.repo.object_url(chunk.location or ""), chunk.offset, chunk.length)
        location = chunk.location or ""
        try:
            url = self.absolute(location)
        except UnknownContainer as e:
            from refmount.refs.icechunk.tree import virtual_refusal

            raise virtual_refusal(location, self.unknown(e.name)) from None
        reason = self.refusal(url)
        if reason:
            from refmount.refs.icechunk.tree import virtual_refusal

            raise virtual_refusal(url, reason)
        if self.access is not None:
            self.access.pin(url, chunk.etag, chunk.last_modified)
        return Ref(RefKind.RANGE, url, chunk.offset, chunk.length)


class IcechunkFormat(Format):
    """An Icechunk repository (format versions 1 and 2), read-only (see the module's docstring)."""

    name = "icechunk"
    revisions = REVISION_KINDS

    def detect(self, source: str, target_options: Options,
               roots: tuple[str, ...] | None = None) -> bool:
        if is_local(source):
            if not os.path.isdir(local_path(source)):
                return False  # a repository is a directory: a file is another format's
        elif source.split("?", 1)[0].split("#", 1)[0].endswith(FILE_SUFFIXES):
            return False  # a reference file by its name: no requests asking for a repository
        return is_repository(source, dict(target_options), roots=roots)

    def _open(self, source: str, target_options: Options, limits: Limits) -> Repository:
        from refmount.refs.icechunk.repository import Repository

        return Repository.open(source, dict(target_options), limits)

    def resolve(self, source: str, target_options: Options, revision: Mapping[str, str] | None,
                limits: Limits = DEFAULT_LIMITS) -> str:
        """The snapshot id that ``revision`` names now."""
        return self._open(source, target_options, limits).resolve(**revision_choice(revision))

    def prepare(self, source: str, target_options: Options, *, bad_keys: str = "error",
                limits: Limits = DEFAULT_LIMITS, cache_dir: str | None = None,
                revision: Mapping[str, str] | None = None) -> IndexFile:
        choice = revision_choice(revision)
        repo = self._open(source, target_options, limits)
        snapshot_id = repo.resolve(**choice)
        metadata_keys(repo.snapshot(snapshot_id), bad_keys, limits)  # the nodes parse and are paths
        return IndexFile("", temporary=False, reused=False, kind=self.name, revision=snapshot_id)

    def targets(self, index: IndexFile) -> Iterator[tuple[str, Callable[[], str]]]:
        return iter(())  # read lazily: targets are checked at read time

    def _snapshot(self, index: IndexFile, source: str, target_options: Options,
                  limits: Limits) -> tuple[Repository, Snapshot]:
        repo = self._open(source, target_options, limits)
        return repo, repo.snapshot(index.revision or repo.resolve(branch="main"))

    def metadata(self, index: IndexFile, source: str, target_options: Options, *,
                 bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS) -> KeyIndex:
        _, snapshot = self._snapshot(index, source, target_options, limits)
        return metadata_keys(snapshot, bad_keys, limits)[0]

    def open_tree(self, index: IndexFile, source: str, target_options: Options, *,
                  bad_keys: str = "error", limits: Limits = DEFAULT_LIMITS,
                  relative: Callable[[str], bool] | None = None,
                  access: Access | None = None) -> OpenedTree:
        from refmount.refs.icechunk.tree import ChunkSource, IcechunkTree

        repo, snapshot = self._snapshot(index, source, target_options, limits)
        metadata, arrays = metadata_keys(snapshot, bad_keys, limits)
        refs = ChunkRefs(repo, access)
        for line in refs.unauthorised():
            log.warning("virtual chunk container %s; its chunks are listed, reading them fails", line)
        tree = IcechunkTree(metadata, arrays, ChunkSource(snapshot.chunk, snapshot.chunk_listing, refs))
        info = {
            "repository": redact_url(repo.root),
            "format_version": str(repo.format_version),
            "snapshot": snapshot.info.id,
            "snapshot_time": snapshot.info.flushed_at,
            "arrays": str(len(arrays)),
            "virtual_containers": " ".join(redact_url(c) for c in refs.containers) or "none",
        }
        named = _names_of(repo, snapshot.info.id)
        if named:
            info["revision"] = named
        own = (repo.object_url("chunks"), dict(target_options))
        return OpenedTree(tree, metadata, _mtime_ns(snapshot.info.flushed_at), info, own_objects=own)

    def identity(self, source: str, target_options: Options,
                 revision: Mapping[str, str] | None = None,
                 roots: tuple[str, ...] | None = None) -> str | None:
        limits = DEFAULT_LIMITS if roots is None else replace(DEFAULT_LIMITS, source_roots=roots)
        return f"icechunk snapshot {self.resolve(source, target_options, revision, limits)}"

    def describe(self, source: str, target_options: Options,
                 revision: Mapping[str, str] | None = None) -> dict[str, str]:
        repo = self._open(source, target_options, DEFAULT_LIMITS)
        choice = revision_choice(revision)
        snapshot_id = repo.resolve(**choice)
        info = repo.snapshot(snapshot_id).info
        (kind, name), = choice.items()
        containers = " ".join(redact_url(c) for c in repo.virtual_chunk_containers())
        return {"repository": redact_url(repo.root), "format_version": str(repo.format_version),
                "revision": f"{kind} {name}", "snapshot": snapshot_id,
                "snapshot_time": info.flushed_at,
                "message": info.message.splitlines()[0] if info.message else "",
                "virtual_containers": containers or "none"}

    def references(self, source: str, target_options: Options,
                   quirks: dict[str, int] | None = None,
                   revision: Mapping[str, str] | None = None,
                   access: Access | None = None) -> Iterator[tuple[str, Ref]]:
        repo = self._open(source, target_options, DEFAULT_LIMITS)
        snapshot = repo.snapshot(repo.resolve(**revision_choice(revision)))
        return snapshot_references(repo, snapshot, access)


def snapshot_references(repo: Repository, snapshot: Snapshot,
                        access: Access | None = None) -> Iterator[tuple[str, Ref]]:
    """Every (key, Ref) of a snapshot, keys sorted within each array: ``zarr.json`` keys
    inline, chunks as the repository records them (native ones as absolute URLs of its
    objects, virtual ones as recorded; with ``access``, those it refuses left out, their
    number logged)."""
    to_ref = ChunkRefs(repo, None)
    checked = ChunkRefs(repo, access) if access is not None else None
    refused: dict[str, int] = {}
    inside = nodes_inside_arrays(snapshot.nodes)
    if inside:
        log.warning("%s nodes inside arrays left out (the first: /%s inside /%s)", f"{len(inside):,}",
                    *next(iter(inside.items())))
    for node in snapshot.nodes:
        if node.path in inside:
            continue
        key = f"{node.path}/zarr.json" if node.path else "zarr.json"
        yield key, Ref(RefKind.INLINE, None, 0, len(node.zarr_json), node.zarr_json)
        if node.kind != "array":
            continue
        try:
            keys = ChunkKeys.from_zarr_json(node.zarr_json)
        except (UnsupportedArray, ValueError):
            continue
        for coords, chunk in snapshot.chunks(node.path):
            if not keys.in_grid(tuple(coords)):
                continue
            name = keys.key(keys.number(tuple(coords)))
            if chunk.kind == "virtual":
                try:
                    url = to_ref.absolute(chunk.location or "")
                except UnknownContainer as e:
                    unknown = f"vcc://{e.name}"
                    refused[unknown] = refused.get(unknown, 0) + 1
                    continue
                if checked is not None and checked.refusal(url):
                    container = checked.container(url) or "(no container)"
                    refused[container] = refused.get(container, 0) + 1
                    continue
                yield (f"{node.path}/{name}" if node.path else name,
                       Ref(RefKind.RANGE, url, chunk.offset, chunk.length))
            else:
                yield f"{node.path}/{name}" if node.path else name, to_ref(chunk)
    for container, n in sorted(refused.items()):
        why = ("the container is not declared by the repository"
               if container == "(no container)" or container.startswith("vcc://")
               else f"the container is not authorised: authorise it with {authorisation(container)}")
        log.warning("%s virtual chunks under %s left out: %s", f"{n:,}", redact_url(container), why)
        if access is not None:
            access.left_out(container, n, why)


def _names_of(repo: Repository, snapshot_id: str) -> str:
    """The branches and tags naming ``snapshot_id`` now, as ``branch main, tag v1``."""
    try:
        names = [f"branch {b}" for b, s in sorted(repo.branches().items()) if s == snapshot_id]
        names += [f"tag {t}" for t, s in sorted(repo.tags().items()) if s == snapshot_id]
    except Exception as e:  # storage that cannot list (plain HTTP), a malformed ref
        log.info("%s: its branches and tags not listed: %s", redact_url(repo.root),
                 redact_url(str(e).splitlines()[0] if str(e) else type(e).__name__))
        return ""
    return ", ".join(names)


def _mtime_ns(flushed_at: str) -> int:
    """The snapshot's flush time as the tree's time stamp (now when it cannot be read)."""
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(flushed_at.replace("Z", "+00:00")).timestamp() * 1e9)
    except (ValueError, TypeError):
        return time.time_ns()

