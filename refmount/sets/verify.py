"""``refmount verify``: is every target of a set there, readable, and long enough?

Each distinct target is asked for its version once (``Fetcher.version``: an HTTP ``HEAD``, a
local ``fstat``, an object store's ``info``), at most ``jobs`` at a time, through the mount's
own fetcher and target policy (so ``allow_local``, ``remote_options``, ``timeout`` and
``retries`` apply as they would to a mount). A target is then

* ``ok``: there, readable, at least as long as the furthest byte a reference reads from it;
* ``missing`` (404, no such file), ``forbidden`` (403, EACCES, refused by the policy);
* ``short``: smaller than the furthest byte a reference reads (``needed``);
* ``changed``: with ``-o pins=FILE``, not the version FILE pins (or not pinned);
* ``error``: anything else (a timeout, a server error), with its reason;
* ``unauthorised``: an Icechunk repository's virtual chunk container the options do not
  authorise (its chunks are not verified), with how many chunks and the option that would.

The furthest byte per target is computed from the index with Arrow (one pass over the URL,
offset and length columns, grouped by URL id), without a Python object per key.
"""

from __future__ import annotations

import errno
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import trio

from refmount.base.progress import Progress
from refmount.base.redact import redact_url
from refmount.base.urls import is_local, local_path
from refmount.refs import Ref, RefKind
from refmount.refs.index import KeyIndex
from refmount.targets.pins import Version

if TYPE_CHECKING:
    from refmount.config import MountConfig
    from refmount.targets.virtualaccess import VirtualAccess

STATUSES = ("ok", "missing", "forbidden", "short", "changed", "error", "unauthorised")


@dataclass
class TargetReport:
    """What ``verify`` found of one target."""

    url: str  # as the set names it (not redacted: redact before showing)
    status: str  # one of STATUSES
    needed: int  # the furthest byte a reference reads (offset + length), 0 if none
    version: Version | None = None
    reason: str = ""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"url": redact_url(self.url), "status": self.status,
                               "needed": self.needed}
        if self.version is not None:
            out.update(self.version.as_json())
        if self.reason:
            out["reason"] = redact_url(self.reason)
        return out


# ---- the furthest byte read from each target ---------------------------------------------


def target_extents(index: KeyIndex) -> dict[str, int]:
    """Per distinct target URL of an index, the furthest byte its references read: the
    largest ``offset + length`` (a whole-target reference: its offset). Vectorised."""
    table = index.table
    if table.num_rows == 0:
        return {}
    refs = table.filter(pc.not_equal(table["kind"], pa.scalar(int(RefKind.INLINE), pa.int8())))
    if refs.num_rows == 0:
        return {}
    refs = refs.combine_chunks()
    url = refs["url"].chunk(0)
    offset, length = refs["offset"], refs["length"]
    ends = pc.if_else(pc.less(length, 0), offset, pc.add_checked(offset, length))
    grouped = pa.table({"id": url.indices, "end": ends}).group_by("id").aggregate([("end", "max")])
    names = url.dictionary.take(grouped["id"]).to_pylist()
    return dict(zip(names, grouped["end_max"].to_numpy().astype(np.int64).tolist(), strict=True))


def extents_of(references: Iterable[tuple[str, Ref]]) -> dict[str, int]:
    """The same for a set read reference by reference (a Parquet set, read lazily)."""
    out: dict[str, int] = {}
    for _, ref in references:
        if ref.kind is RefKind.INLINE or ref.url is None:
            continue
        end = ref.offset if ref.length < 0 else ref.offset + ref.length
        if end > out.get(ref.url, -1):
            out[ref.url] = end
    return out


# ---- judging one target --------------------------------------------------------------------


def judge(url: str, needed: int, found: Version | BaseException,
          pin: Version | None = None, pinned: bool = False) -> TargetReport:
    """The report of one target from its version or the error asking for it raised;
    ``pinned``: the set is checked against pins (``pin``: this target's, None if unpinned)."""
    if isinstance(found, BaseException):
        code = getattr(found, "errno", None)
        reason = str(getattr(found, "reason", None) or found)
        if isinstance(found, FileNotFoundError) or code == errno.ENOENT:
            return TargetReport(url, "missing", needed, reason=reason)
        if isinstance(found, PermissionError) or code == errno.EACCES:
            return TargetReport(url, "forbidden", needed, reason=reason)
        return TargetReport(url, "error", needed, reason=reason)
    if found.size is not None and found.size < needed:
        return TargetReport(url, "short", needed, found,
                            f"{found.size:,} bytes, references read up to byte {needed:,}")
    if pinned:
        why = "not pinned" if pin is None else pin.mismatch(found)
        if why is not None:
            return TargetReport(url, "changed", needed, found, why)
    return TargetReport(url, "ok", needed, found)


# ---- reports -------------------------------------------------------------------------------


def summary(reports: list[TargetReport]) -> dict[str, int]:
    counts = {"targets": len(reports), **dict.fromkeys(STATUSES, 0)}
    for r in reports:
        counts[r.status] += 1
    return counts


def summary_line(reports: list[TargetReport]) -> str:
    counts = summary(reports)
    parts = [f"{counts['targets']:,} targets", f"{counts['ok']:,} ok"]
    parts += [f"{counts[s]:,} {s}" for s in STATUSES[1:] if counts[s]]
    return ", ".join(parts)


def format_report(reports: list[TargetReport]) -> str:
    """A table of the targets with a problem (status, target, what is wrong), then the
    summary line. No credentials: URLs and reasons are redacted."""
    bad = sorted((r for r in reports if r.status != "ok"), key=lambda r: (r.status, r.url))
    lines = []
    if bad:
        rows = [("status", "target", "problem")]
        rows += [(r.status, redact_url(r.url), redact_url(r.reason) or "-") for r in bad]
        widths = [max(len(row[i]) for row in rows) for i in range(2)]
        for i, row in enumerate(rows):
            lines.append(f"{row[0]:<{widths[0]}}  {row[1]:<{widths[1]}}  {row[2]}".rstrip())
            if i == 0:
                lines.append(f"{'-' * widths[0]}  {'-' * widths[1]}  {'-' * 7}")
    lines.append(summary_line(reports))
    return "\n".join(lines)


def report_json(reports: list[TargetReport], source: str) -> str:
    """One JSON object: the source, the counts and every target with its status."""
    return json.dumps({"source": redact_url(source), "summary": summary(reports),
                       "targets": [r.as_json() for r in sorted(reports, key=lambda r: r.url)]},
                      indent=1)


def exit_status(reports: list[TargetReport]) -> int:
    """0 when every target is ok, 1 otherwise."""
    return 0 if all(r.status == "ok" for r in reports) else 1


def pinnable(reports: list[TargetReport]) -> list[tuple[str, Version]]:
    """The versions to pin: those of the targets found whole (ok, or changed since the pins
    checked against). Missing, refused, short and failed targets are not pinned."""
    return [(r.url, r.version) for r in reports
            if r.status in ("ok", "changed") and r.version is not None and r.version.size is not None]


# ---- asking the stores -----------------------------------------------------------------------


class VersionSource(Protocol):
    """What ``check_targets`` needs of the fetcher (a fake one in tests)."""

    async def version(self, url: str) -> Version: ...


async def check_targets(fetcher: VersionSource, extents: dict[str, int], *, jobs: int,
                        pins: Mapping[str, Version] | None = None,
                        progress: Progress | None = None) -> list[TargetReport]:
    """Every target of ``extents`` asked for its version once, by ``jobs`` workers taking the
    next target in turn (tasks and requests in flight: at most ``jobs``, however many targets);
    each within the fetcher's own deadline (``timeout``, retries included)."""
    reports: list[TargetReport] = []
    todo = iter(extents.items())

    async def worker() -> None:
        for url, needed in todo:  # one trio thread: each target is taken by one worker
            found: Version | BaseException
            try:
                found = await fetcher.version(url)
            except Exception as e:
                found = e
            reports.append(judge(url, needed, found, None if pins is None else pins.get(url),
                                 pinned=pins is not None))
            if progress is not None:
                progress.count += 1

    async with trio.open_nursery() as nursery:
        for _ in range(min(jobs, len(extents))):
            nursery.start_soon(worker)
    return reports


def set_extents(cfg: MountConfig, access: VirtualAccess | None = None,
                left_out: list[TargetReport] | None = None,
                own: list[str] | None = None) -> dict[str, int]:
    """The furthest byte read from each target of SOURCE (parsed under the mount's limits
    into a temporary index; a set read lazily, reference by reference). ``access``: what
    authorises virtual chunks (one of the mount's kind, without pins, if not given);
    ``left_out`` receives a report per virtual chunk container whose chunks the options do
    not authorise; ``own`` the URL prefix of the set's own objects read as targets (a local
    Icechunk repository's ``chunks``), which a mount reads whatever ``allow_local`` names."""
    import contextlib
    import os

    from refmount.refs import format_named, named_format, prepare_index, revision_of
    from refmount.refs.limits import Limits

    index_file = prepare_index(cfg.source, cfg.target_options, bad_keys=cfg.bad_keys,
                               limits=Limits.from_config(cfg), cache_dir=None,
                               format=named_format(cfg), revision=revision_of(cfg))
    try:
        if index_file.path:
            return target_extents(KeyIndex.open(index_file.path))
        from refmount.targets.rules import TargetRules
        from refmount.targets.virtualaccess import VirtualAccess

        revision = {"snapshot": index_file.revision} if index_file.revision else None
        if own is not None and index_file.kind == "icechunk" and is_local(cfg.source):
            own.append(local_path(cfg.source).rstrip("/") + "/chunks")
        if access is None:
            access = VirtualAccess(TargetRules.from_json(cfg.targets), cfg.allow_local, None)
        extents = extents_of(format_named(index_file.kind).references(
            cfg.source, cfg.target_options, revision=revision, access=access))
        for container, (n, why) in sorted(access.refused.items()):
            if left_out is not None:
                left_out.append(TargetReport(container, "unauthorised", 0,
                                             reason=f"{n:,} virtual chunks not verified: {why}"))
        return extents
    finally:
        if index_file.temporary:
            with contextlib.suppress(OSError):
                os.unlink(index_file.path)


def verify_set(cfg: MountConfig, *, jobs: int) -> list[TargetReport]:
    """Verify every target of ``cfg.source`` with the fetcher and policy a mount of it with
    ``cfg`` would have; with ``cfg.pins``, also against those pins."""
    from refmount.base import guestloop
    from refmount.base.stats import Stats
    from refmount.targets.fetch import Fetcher
    from refmount.targets.pins import read_pins
    from refmount.targets.policy import target_policy
    from refmount.targets.rules import TargetRules
    from refmount.targets.virtualaccess import VirtualAccess

    pins = read_pins(cfg.pins) if cfg.pins else None
    rules = TargetRules.from_json(cfg.targets)
    access = VirtualAccess(rules, cfg.allow_local, None)  # learns the virtual chunk containers
    left_out: list[TargetReport] = []
    own: list[str] = []
    with Progress(f"indexing {redact_url(cfg.source)}", keys=False):
        extents = set_extents(cfg, access, left_out, own)
    fetcher = Fetcher(cfg.remote_options, target_policy(cfg, own[0] if own else None), timeout=cfg.timeout,
                      retries=cfg.retries, max_connections=cfg.max_connections, stats=Stats(),
                      rules=rules, virtual=access)  # read (and redirected) where a mount reads them
    reports: list[TargetReport] = []

    async def main(progress: Progress) -> None:
        reports.extend(await check_targets(fetcher, extents, jobs=jobs, pins=pins,
                                           progress=progress))
        reports.extend(left_out)

    # As in the daemon: trio a guest of the asyncio loop fsspec's async file systems run on,
    # one thread (no hop to fsspec's own loop thread per request).
    with Progress(f"verifying {len(extents):,} targets", unit="targets") as progress:
        guestloop.run(main, progress, on_loop=fetcher.bind_loop, before_close=fetcher.aclose)
    return reports
