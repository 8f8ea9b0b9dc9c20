"""Where branches and tags point: spec version 1's ``refs/`` files, version 2's repo info."""

from __future__ import annotations

import re
import urllib.parse
from dataclasses import dataclass, field

import orjson

from refmount.refs.icechunk import ids, schema
from refmount.refs.icechunk.config import Declared, containers_from_flexbuffer
from refmount.refs.icechunk.errors import IcechunkError
from refmount.refs.icechunk.fbs.Repo import Repo
from refmount.refs.icechunk.records import SnapshotInfo
from refmount.refs.icechunk.snapshot import iso_time
from refmount.refs.icechunk.verify import verify

MAX_REF_JSON = 64 << 10


_CONTROL = re.compile("[\x00-\x1f\x7f]")
MAX_REF_NAME = 1024


def _plain_ref_name_ok(name: str) -> bool:
    return (bool(name) and len(name) <= MAX_REF_NAME and "/" not in name and "\\" not in name
            and ".." not in name and name != "." and _CONTROL.search(name) is None)


def ref_name_ok(name: str) -> bool:
    """Whether ``name`` may name a branch or tag: not empty, no ``/``, ``\\``, ``..`` or
    control character, and the same once percent-escapes are decoded (``a%2F..`` names no
    path outside ``refs/`` on storage that decodes them, HTTP's)."""
    for _ in range(4):
        if not _plain_ref_name_ok(name):
            return False
        decoded = urllib.parse.unquote(name)
        if decoded == name:
            return True
        name = decoded
    return False


def parse_ref_json(data: bytes, name: str) -> str:
    """The snapshot id in a version 1 ``ref.json`` (``{"snapshot": "<id>"}``)."""
    try:
        doc = orjson.loads(data)
    except orjson.JSONDecodeError:
        raise IcechunkError(f"{name}: not JSON") from None
    snap = doc.get("snapshot") if isinstance(doc, dict) else None
    if not isinstance(snap, str) or not ids.is_id12(snap):
        raise IcechunkError(f"{name}: no snapshot id (expected {{\"snapshot\": \"<20 characters>\"}})")
    return snap


@dataclass
class RepoInfo:
    """A version 2 repo info object: branches, tags, snapshot summaries, the config."""

    branches: dict[str, str]
    tags: dict[str, str]
    deleted_tags: set[str]
    snapshots: dict[str, SnapshotInfo]
    containers: Declared = field(default_factory=Declared)


def parse_repo_info(data: bytes | bytearray, name: str, max_entries: int) -> RepoInfo:
    root = verify(data, schema.REPO, name)
    repo = Repo.GetRootAs(data, 0)
    count = repo.SnapshotsLength()
    if count + repo.BranchesLength() + repo.TagsLength() > max_entries:
        raise IcechunkError(f"{name}: more than {max_entries:,} snapshots, branches and tags "
                            "(limit max_keys)")
    snapshot_ids = []
    for i in range(count):
        snapshot_ids.append(ids.encode(bytes(repo.Snapshots(i).Id().Bytes())))
    snapshots = {}
    for i in range(count):
        s = repo.Snapshots(i)
        parent = s.ParentOffset()
        if parent >= count or parent < -1:
            raise IcechunkError(f"{name}: a snapshot's parent index {parent} is outside the snapshot list")
        snapshots[snapshot_ids[i]] = SnapshotInfo(
            snapshot_ids[i], snapshot_ids[parent] if parent >= 0 else None, iso_time(s.FlushedAt()),
            (s.Message() or b"").decode("utf-8", "replace"))

    def refs(length: int, get: object) -> dict[str, str]:
        out = {}
        for i in range(length):
            r = get(i)  # type: ignore[operator]
            ref = r.Name().decode("utf-8", "replace")
            index = r.SnapshotIndex()
            if index >= count:
                raise IcechunkError(f"{name}: the ref {ref!r} points past the snapshot list")
            out[ref] = snapshot_ids[index]
        return out

    deleted = {repo.DeletedTags(i).decode("utf-8", "replace") for i in range(repo.DeletedTagsLength())}
    config = root.children["config"]
    start = int(config.start[0])  # type: ignore[union-attr]
    raw = data[start:start + int(config.length[0])] if start >= 0 else b""  # type: ignore[union-attr]
    tags = {k: v for k, v in refs(repo.TagsLength(), repo.Tags).items() if k not in deleted}
    return RepoInfo(refs(repo.BranchesLength(), repo.Branches), tags, deleted, snapshots,
                    containers_from_flexbuffer(raw, name))
