"""A target's version as its store reports it (``Version``), and the error of a response or
file descriptor that shows another than the pinned one (``VersionChanged``). Pins (targets/pins.py)
are made of these; the local reader (targets/localfile.py) checks them. Pure: no imports of refmount.
"""

from __future__ import annotations

import datetime
import email.utils
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

__all__ = ["Version", "VersionChanged"]

_FIELDS = ("size", "etag", "last_modified", "mtime_ns", "version_id")


class VersionChanged(Exception):
    """A response (or a file descriptor) shows a version other than the pinned one; the
    message says what differs. Raised where the bytes are read, turned into ``PinMismatch``
    by the fetcher."""


@dataclass(frozen=True, slots=True)
class Version:
    """A target's version as its store reports it; None where it reports nothing."""

    size: int | None = None
    etag: str | None = None
    last_modified: str | None = None
    mtime_ns: int | None = None
    version_id: str | None = None
    # seconds since the epoch: the target may not have been modified after this time (an
    # Icechunk virtual chunk's recorded time); not part of a pin file
    modified_by: int | None = None

    @classmethod
    def from_headers(cls, headers: Mapping[str, str], size: int | None) -> Version:
        """From an HTTP response's headers; ``size``: the object's size the response tells
        (a ``Content-Range`` total, or the ``Content-Length`` of a whole answer)."""
        return cls(size=size, etag=headers.get("ETag") or None,
                   last_modified=headers.get("Last-Modified") or None)

    @classmethod
    def from_info(cls, info: Mapping[str, Any]) -> Version:
        """From an fsspec ``info`` dict (http, s3, gcs, ... spell the fields differently)."""
        size = info.get("size")
        etag = info.get("ETag") or info.get("etag")
        modified = (info.get("Last-Modified") or info.get("LastModified") or info.get("mtime")
                    or info.get("updated"))
        mtime_ns = info.get("mtime_ns")
        version = info.get("VersionId") or info.get("version_id") or info.get("generation")
        return cls(size=int(size) if size is not None else None,
                   etag=str(etag) if etag else None,
                   last_modified=str(modified) if modified and mtime_ns is None else None,
                   mtime_ns=int(mtime_ns) if mtime_ns is not None else None,
                   version_id=str(version) if version and version != "null" else None)

    def as_json(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in _FIELDS if getattr(self, name) is not None}

    def token(self) -> str:
        """A stable text naming this version (part of the disk cache's key of a pinned target)."""
        doc = self.as_json()
        if self.modified_by is not None:
            doc["modified_by"] = self.modified_by
        return json.dumps(doc, sort_keys=True)

    @property
    def strong_etag(self) -> str | None:
        """The ETag if it is a strong one (``If-Match`` compares strong ETags only)."""
        return self.etag if self.etag and not self.etag.startswith("W/") else None

    def mismatch(self, seen: Version) -> str | None:
        """Why ``seen`` (what a response or descriptor showed) is not this pinned version, or
        None if it is. Every field of the pin that ``seen`` reports must be equal; the ETag,
        the modification time and the version id must be reported when pinned; the size may
        go unreported (a ``Content-Range`` total of ``*``) only when an ETag or version id
        matched."""
        if seen.size is not None and self.size is not None and seen.size != self.size:
            return f"size {seen.size:,} bytes, pinned {self.size:,}"
        for name, label in (("etag", "ETag"), ("version_id", "version id"),
                            ("mtime_ns", "modification time (ns)"),
                            ("last_modified", "modification time")):
            pinned, now = getattr(self, name), getattr(seen, name)
            if pinned is None:
                continue
            if now is None:
                return f"the store reports no {label}, pinned {pinned}"
            if now != pinned:
                return f"{label} {now}, pinned {pinned}"
        if seen.size is None and self.size is not None and self.etag is None and self.version_id is None:
            return "the store reports neither the size nor an ETag"
        if self.modified_by is not None:
            when = seen.modified_seconds()
            if when is None:
                return "the store reports no modification time"
            if when > self.modified_by:
                return (f"modified at {_iso(when)}, after {_iso(self.modified_by)} (the time "
                        "recorded with the reference)")
        return None

    def modified_seconds(self) -> float | None:
        """The modification time reported, in seconds since the epoch (None: none, or not
        readable)."""
        if self.mtime_ns is not None:
            return self.mtime_ns / 1e9
        if not self.last_modified:
            return None
        try:
            return email.utils.parsedate_to_datetime(self.last_modified).timestamp()
        except (TypeError, ValueError):
            pass
        try:
            when = datetime.datetime.fromisoformat(self.last_modified)
        except ValueError:
            return None
        return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).timestamp()


def _iso(seconds: float) -> str:
    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
