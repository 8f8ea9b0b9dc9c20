"""What a listing says of a file, as the HTTP view's ``HEAD`` of it would: its served size and
its strong ``ETag`` (``http/validators.py``), from the tree's node without reading its bytes
(a whole-file target not yet measured is measured, as ``HEAD`` measures it)."""

from __future__ import annotations

import logging
from typing import Any, Protocol

from refmount.base.errors import ReadError
from refmount.http.pathplan import Found, Unavailable
from refmount.http.s3xml import ListItem
from refmount.http.validators import etag_for, ref_parts

log = logging.getLogger(__name__)

__all__ = ["Planner", "file_info", "zmetadata_info"]


class Planner(Protocol):
    """What is asked of the HTTP front end (``PathPlanner``, which ``HttpFrontEnd`` extends): a
    protocol, so that the front end's modules and these import nothing of each other's."""

    core: Any  # its SetCore
    _identity: str

    def _file_found(self, key: str, node: Any, ref: Any, size: int, array: Any) -> Found: ...

    async def _synthesizes_zmetadata(self) -> bool: ...

    async def _synthesized_zmetadata(self) -> bytes: ...


async def file_info(front: Planner, node: Any, key: bytes, size: int) -> ListItem | None:
    """In trio: the size and ETag of the file ``node`` (key ``key``, its listed ``size``);
    None when the HTTP view would not serve it (left out, one log line)."""
    core = front.core
    text = key.decode("utf-8", "surrogateescape")
    try:
        ref = await core.tree.ref(node)
        array = core.array(node)
        if array is None and size < 0:
            size = await core.reader.size(ref)
    except (FileNotFoundError, ReadError, Unavailable, ValueError) as e:
        # a key gone, a size that cannot be measured, the decoded view refusing the key
        log.warning("listing leaves out %s: %s", text, e)
        return None
    found = front._file_found(text, node, ref, size, array)
    etag = etag_for(
        ref_parts(
            ref,
            set_identity=front._identity,
            mtime_ns=core.mtime_ns,
            decoded=array is not None,
            size=found.size,
        )
    )
    return ListItem(key, found.size, etag)


async def zmetadata_info(front: Planner) -> ListItem | None:
    """In trio: the synthesized ``.zmetadata`` of a set that has none (None otherwise)."""
    tree = front.core.tree
    if await tree.lookup(tree.root, b".zmetadata") is not None or not await front._synthesizes_zmetadata():
        return None
    data = await front._synthesized_zmetadata()
    if data is None:
        return None
    return ListItem(
        b".zmetadata", len(data), etag_for(b"refmount-zmetadata\0" + front._identity.encode() + b"\0" + data)
    )
