"""Reading one Parquet record file within a bound on what it may decode to.

A record file is small on disk whatever it decodes to: a dictionary page holding one large
value that every row repeats, front-coded (``DELTA_BYTE_ARRAY``) values sharing a long prefix,
or millions of null rows all compress to a few kilobytes. So nothing is decoded before the
footer has been checked, and what is decoded is counted as it comes:

* the footer (its length, thrift strings and lists) is bounded before it is parsed;
* the rows (the sum over row groups) may not exceed ``record_size``, the rows a record holds;
* the column chunks of the columns read (``path``, ``offset``, ``size``, ``raw``) declare their
  uncompressed sizes: these plus a per-row cost must fit in ``max_bytes``;
* ``path`` and ``raw`` are read as dictionaries (a value stored once stays in memory once),
  unless encoded in a way Arrow cannot read into one (front coding);
* rows are read in batches, and the bytes of each batch are added up (a dictionary counted
  once): a file whose data decode to more than ``max_bytes`` is refused after one batch
  beyond it. A batch of front-coded values has at most ``max_bytes / chunk size`` rows, each
  value being at most its column chunk's uncompressed size.

A file over any bound raises :class:`RecordRefused` naming the file and the bound.
"""

from __future__ import annotations

from typing import IO

import pyarrow as pa
import pyarrow.parquet as pq

from refmount.refs.limits import size_text
from refmount.refs.model import ReferenceSetError

COLUMNS = ("path", "offset", "size", "raw")
DICTIONARY_COLUMNS = ("path", "raw")
AS_DICTIONARY = {"PLAIN", "PLAIN_DICTIONARY", "RLE_DICTIONARY", "RLE", "BIT_PACKED"}
# Memory per row beyond the Arrow data counted batch by batch: the per-row arrays a decoded
# Record keeps (sizes, offsets, dictionary indices, flags).
ROW_COST = 32
BATCH_ROWS = 65536
THRIFT_LISTS = 100_000  # longest list in a footer (row groups, columns, encodings ...)


class RecordRefused(ReferenceSetError):
    """A record file over a bound (or malformed): the same answer every time it is read."""


def _footer_length(f: IO[bytes]) -> int | None:
    """The length the file's last 8 bytes give its footer (None if it cannot be told)."""
    try:
        size = f.seek(0, 2)
        if size < 12:
            return None
        f.seek(size - 8)
        tail = f.read(8)
        f.seek(0)
    except (OSError, ValueError):
        return None
    if len(tail) != 8 or tail[4:] != b"PAR1":
        return None
    return int.from_bytes(tail[:4], "little")


def _batch_bytes(batch: pa.RecordBatch, dictionaries: set[int]) -> int:
    total = 0
    for column in batch.columns:
        if pa.types.is_dictionary(column.type):
            total += column.indices.nbytes
            address = next((b.address for b in column.dictionary.buffers() if b is not None), 0)
            if address not in dictionaries:  # batches of one row group share its dictionary
                dictionaries.add(address)
                total += column.dictionary.nbytes
        else:
            total += column.nbytes
    return total


def read_record(f: IO[bytes], where: str, record_size: int, max_bytes: int) -> pa.Table:
    """The columns of ``COLUMNS`` that the record file ``f`` has, ``path`` and ``raw`` as
    dictionaries, refusing a file that would decode to more than ``max_bytes``."""
    bound = f"max_record={size_text(max_bytes)} (raise max_record to read it)"
    footer = _footer_length(f)
    if footer is not None and footer > max_bytes:
        raise RecordRefused(f"{where}: a Parquet footer of {footer:,} bytes, over {bound}")
    limits = {"thrift_string_size_limit": max(max_bytes, 1 << 20),
              "thrift_container_size_limit": THRIFT_LISTS}
    plain = pq.ParquetFile(f, **limits)
    md = plain.metadata
    names = set(plain.schema_arrow.names)
    wanted = [c for c in COLUMNS if c in names]
    rows = max(md.num_rows, sum(md.row_group(g).num_rows for g in range(md.num_row_groups)))
    if rows > record_size:
        raise RecordRefused(f"{where}: {rows:,} rows, more than record_size={record_size:,} "
                            "(the rows a record file holds)")
    declared = rows * ROW_COST
    front_coded = 0  # the largest column chunk of front-coded values
    encodings: dict[str, set[str]] = {c: set() for c in wanted}
    for g in range(md.num_row_groups):
        group = md.row_group(g)
        for j in range(group.num_columns):
            chunk = group.column(j)
            if chunk.path_in_schema in wanted:
                size = max(chunk.total_uncompressed_size, 0)
                declared += size
                encodings[chunk.path_in_schema].update(chunk.encodings)
                if "DELTA_BYTE_ARRAY" in chunk.encodings:
                    front_coded = max(front_coded, size)
    if declared > max_bytes:
        raise RecordRefused(f"{where}: {rows:,} rows and {declared - rows * ROW_COST:,} bytes of "
                            f"column data decode to more than {bound}")
    # Arrow reads plain and dictionary-encoded values into a dictionary, not others.
    dictionary = [c for c in DICTIONARY_COLUMNS if c in wanted and encodings[c] <= AS_DICTIONARY]
    reader = pq.ParquetFile(f, metadata=md, read_dictionary=dictionary, **limits)
    batch_rows = BATCH_ROWS
    if front_coded:
        batch_rows = max(1, min(BATCH_ROWS, max_bytes // front_coded))
    batches = []
    used = rows * ROW_COST
    dictionaries: set[int] = set()
    for batch in reader.iter_batches(batch_size=batch_rows, columns=wanted, use_threads=False):
        used += _batch_bytes(batch, dictionaries)
        if used > max_bytes:
            raise RecordRefused(f"{where}: its rows decode to more than {bound}")
        batches.append(batch)
    schema = reader.schema_arrow
    return pa.Table.from_batches(batches, pa.schema([schema.field(c) for c in wanted]))
