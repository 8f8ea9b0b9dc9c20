"""What the decoded view (``-o decode``) may parse and synthesize, in all, for one set.

The view rewrites a set's ``.zarray``, ``.zattrs`` and ``.zmetadata`` keys (decode/view.py) and
shows each Zarr v3 ``zarr.json`` as v2 documents (decode/v3view.py). Each
document is parsed only under its own cap, but a set may hold any number of them, and a
rewritten document may be larger than the one it comes from (``indent=4``, typed numbers). So
the whole view is built within the bounds the server's synthesized ``.zmetadata`` is
(core/consolidated.py) and a Parquet set's ``.zmetadata`` is read under (refs/zmetadata.py):

* at most ``MAX_BYTES`` of metadata read (keys' names and the documents parsed, ``zarr.json``
  included) and, apart, of metadata written (the rewritten documents kept, and the v2
  documents made for v3 nodes);
* at most ``MAX_VALUES`` JSON values parsed (each key one, and every ``{``, ``[`` and ``,`` of
  a document one more: an upper bound on the Python objects its parse makes).

Each bound is checked before the parse or the write that would pass it. A set past a bound has
no decoded view: ``DecodedMetadataRefused`` (a ``ReadError``: ``EIO`` in a mount, ``503`` over
HTTP) for every metadata key the view would rewrite, one log line when the view is built.
"""

from __future__ import annotations

from refmount.base.errors import ReadError
from refmount.refs.zmetadata import MAX_VALUES

__all__ = ["MAX_BYTES", "MAX_VALUES", "DecodedMetadataRefused", "MetadataBudget", "is_view_metadata"]

MAX_BYTES = 64 << 20  # metadata read, and metadata written, at most (as for .zmetadata)
VIEW_NAMES = (".zarray", ".zattrs", ".zmetadata")


class DecodedMetadataRefused(ReadError):
    """The set's metadata is past a bound of the decoded view (the message says which)."""


def is_view_metadata(key: str) -> bool:
    """Whether ``key`` is a metadata key the decoded view rewrites."""
    return key.rpartition("/")[2] in VIEW_NAMES


def values_in(data: bytes | memoryview) -> int:
    """An upper bound on the JSON values of ``data``: one, plus one per ``{``, ``[`` or ``,``
    (those inside strings counted too)."""
    raw = data if isinstance(data, bytes) else bytes(data)
    return 1 + raw.count(b"{") + raw.count(b"[") + raw.count(b",")


class MetadataBudget:
    """What the view has read, parsed and written so far; ``DecodedMetadataRefused`` as soon
    as a bound would be passed."""

    def __init__(self, max_bytes: int = MAX_BYTES, max_values: int = MAX_VALUES) -> None:
        self.max_bytes = max_bytes
        self.max_values = max_values
        self.read = 0
        self.values = 0
        self.written = 0

    def keys(self, count: int) -> None:
        """``count`` metadata keys are to be looked at (each is at least one value)."""
        self._values(count, f"it has more than {self.max_values:,} metadata keys")

    def name(self, key: str) -> None:
        self._read(len(key))

    def parse(self, data: bytes | memoryview) -> None:
        """A document is about to be parsed."""
        self._read(len(data))
        self._values(values_in(data), f"its metadata keys hold more than {self.max_values:,} JSON values")

    def write(self, data: bytes) -> bytes:
        """A rewritten document is to be kept; returned as it is."""
        self.written += len(data)
        if self.written > self.max_bytes:
            raise DecodedMetadataRefused(f"its rewritten metadata is over {self.max_bytes:,} bytes")
        return data

    def _read(self, n: int) -> None:
        self.read += n
        if self.read > self.max_bytes:
            raise DecodedMetadataRefused(f"its metadata keys hold more than {self.max_bytes:,} bytes")

    def _values(self, n: int, why: str) -> None:
        self.values += n
        if self.values > self.max_values:
            raise DecodedMetadataRefused(why)
