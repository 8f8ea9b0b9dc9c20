"""Preparing a set's index before anything serves it: what the CLI (before it hands over to a
detached daemon) and the indexer child (``refmount -f``, serving/indexer.py) both do.

``index_source`` parses or validates SOURCE in its format (``refs.prepare_index``) under the
mount's limits; ``check_index_targets`` refuses the set if a target known before mounting may
not be read (or, with ``-o pins``, is not pinned: against the table the CLI parsed the pin
file into, targets/pinhandover.py);
``advise_on_decoding`` says on stderr which arrays ``-o decode`` serves as
referenced, or that some would need it; ``remove_temporary`` drops an index file that no
process will map (it holds every target URL of the set).
"""

from __future__ import annotations

import contextlib
import os
import sys

from refmount.base.progress import Progress
from refmount.base.redact import redact_url
from refmount.config import MountConfig
from refmount.refs import IndexFile, format_named, named_format, prepare_index, revision_of
from refmount.refs.limits import Limits
from refmount.targets.pinhandover import pins_for_check
from refmount.targets.policy import TargetRefused, check_targets


def index_source(cfg: MountConfig) -> IndexFile:
    """Parse or validate SOURCE in its format (refs.prepare_index) under the mount's limits,
    with a progress line on a terminal when it takes a while."""
    if cfg.source_roots is not None:
        _check_confined_source(cfg.source, cfg.source_roots)
    with Progress(f"indexing {redact_url(cfg.source)}", keys=False):
        return prepare_index(cfg.source, cfg.target_options, bad_keys=cfg.bad_keys,
                             limits=Limits.from_config(cfg),
                             cache_dir=cfg.cache_dir if cfg.disk_cache else None,
                             format=named_format(cfg), revision=revision_of(cfg))


def _check_confined_source(source: str, roots: list[str]) -> None:
    """A catalogue's local set file (a Parquet set's ``.zmetadata``) opens beneath ``roots``
    with no symlink followed, before any index of it (a persisted one included) is used: the
    set is read through the same checks again (``Limits.source_roots``). A directory without
    ``.zmetadata`` (an Icechunk repository) must itself lie beneath ``roots``; its objects are
    each opened confined when read (``refs/icechunk/storage.py``)."""
    from refmount.base.confinedopen import NotARegularFile, open_checked
    from refmount.base.urls import is_local, local_path
    from refmount.refs.model import ReferenceSetError

    if not is_local(source):
        return
    path = os.path.abspath(local_path(source))
    if os.path.isdir(path):
        if not os.path.lexists(os.path.join(path, ".zmetadata")):
            real = os.path.realpath(path)
            if not any(real == r or r == "/" or real.startswith(r.rstrip("/") + "/") for r in roots):
                raise ReferenceSetError(f"{source}: not opened: outside the allowed directories "
                                        "(a set of a shared catalogue must lie beneath its "
                                        "directory or allow_local, and not through a symlink "
                                        "leaving it)")
            return
        path = os.path.join(path, ".zmetadata")
    try:
        fd, _ = open_checked(path, roots)
    except (OSError, NotARegularFile) as e:
        why = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        raise ReferenceSetError(f"{source}: not opened: {why} (a set file of a shared catalogue "
                                "must lie beneath its directory or allow_local, and not through a "
                                "symlink leaving it)") from None
    os.close(fd)


def check_index_targets(cfg: MountConfig, index_file: IndexFile) -> None:
    """Refuse the set if a target known before mounting may not be read (TargetRefused), or,
    with ``-o pins``, is not pinned."""
    targets = format_named(index_file.kind).targets(index_file)
    if cfg.pins:
        pins = pins_for_check(cfg)
        targets = list(targets)
        unpinned = [(url, key_of) for url, key_of in targets if url not in pins]
        if unpinned:
            url, key_of = unpinned[0]
            raise TargetRefused(f"key {key_of()!r}: {redact_url(url)}: not pinned in {cfg.pins} "
                                f"({len(unpinned):,} of the set's {len(targets):,} targets are "
                                "not); pin them with 'refmount verify SOURCE --pin FILE'")
    check_targets(cfg, targets)


NOTE_KEYS = 30_000  # metadata keys the note on encoded arrays reads (without -o decode)


def advise_on_decoding(cfg: MountConfig, index_file: IndexFile) -> None:
    """On stderr before the daemon takes over (its warnings go to its log): with ``-o decode``,
    the arrays served as referenced; without it, one note when some arrays are compressed or
    big-endian, which clients without zarr's codecs (ncdump, CDO, NCO, GDAL) would read as
    plausible wrong numbers."""
    from refmount.decode.view import DecodedView

    metadata = format_named(index_file.kind).metadata(index_file, cfg.source, cfg.target_options,
                                                      bad_keys=cfg.bad_keys,
                                                      limits=Limits.from_config(cfg))
    # Without -o decode the note looks at the first NOTE_KEYS metadata keys only: a set of a
    # million arrays must not spend minutes on a hint before it is served.
    view = DecodedView.from_index(metadata, cfg.max_chunk_bytes, first=None if cfg.decode else NOTE_KEYS)
    if cfg.decode:
        view.warn()
        return
    encoded = [p for p, a in view.arrays.items() if a.codecs or a.dtype != a.out_dtype]
    if not encoded:
        return
    names = sorted(path or "/" for path in encoded)
    codecs = sorted({c for path in encoded for c in view.codecs.get(path, [])})
    more = f" and {len(names) - 3} more" if len(names) > 3 else ""
    if view.sampled:
        more += f" (among the first {NOTE_KEYS:,} metadata keys)"
    shown = ", ".join(names[:3]) + more
    how = f"use codecs ({', '.join(codecs)})" if codecs else "are stored big-endian"
    again = "serve with 'refmount serve SOURCE -o decode'" if cfg.serving else "mount with -o decode"
    print(f"refmount: note: arrays {shown} {how}: clients without zarr's codecs (ncdump, CDO, "
          f"NCO, GDAL) would read their chunks as raw bytes; {again} for them",
          file=sys.stderr)


def remove_temporary(index_file: IndexFile) -> None:
    """Remove a temporary index file (a persisted one under ``cache_dir/index`` stays)."""
    if index_file.temporary:
        with contextlib.suppress(OSError):
            os.unlink(index_file.path)
