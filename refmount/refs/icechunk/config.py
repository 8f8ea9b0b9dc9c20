"""The virtual chunk containers a repository's configuration declares: their URL prefixes,
and the names of those that have one (what a relative ``vcc://NAME/path`` location names).

Spec version 1 keeps the configuration in ``config.yaml`` (serde_yaml: enum variants are
YAML tags such as ``!s3``, read here as plain values; aliases are refused, so a small file
cannot expand); version 2 in the repo info object's ``config`` field, as FlexBuffers, read
here through a walk bounded by the buffer's size (the runtime's own ``Loads`` would follow
any count the buffer claims).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from flatbuffers import flexbuffers

from refmount.refs.icechunk.errors import IcechunkError

MAX_CONFIG = 1 << 20


@dataclass
class Declared:
    """The containers a repository declares: every URL prefix (sorted), and name -> URL prefix
    for the named ones."""

    prefixes: list[str] = field(default_factory=list)
    names: dict[str, str] = field(default_factory=dict)


def _declared(found: list[tuple[Any, str]], name: str) -> Declared:
    """``found``: (the container's name field, its URL prefix). A name that is not a non-empty
    string without ``/`` cannot be named by a location (icechunk refuses to write one) and is
    left out; two containers of one name with different prefixes refuse the config."""
    names: dict[str, str] = {}
    for cname, prefix in found:
        if not isinstance(cname, str) or not cname or "/" in cname:
            continue
        if names.setdefault(cname, prefix) != prefix:
            raise IcechunkError(f"{name}: two virtual chunk containers are named {cname!r}")
    return Declared(sorted({p for _, p in found}), names)


class _Loader(yaml.SafeLoader):
    """SafeLoader that reads a tagged node as its untagged value."""


def _untagged(loader: yaml.SafeLoader, suffix: str, node: yaml.Node) -> Any:
    if isinstance(node, yaml.MappingNode):
        return loader.construct_mapping(node, deep=True)
    if isinstance(node, yaml.SequenceNode):
        return loader.construct_sequence(node, deep=True)
    return loader.construct_scalar(node)  # type: ignore[arg-type]


_Loader.add_multi_constructor("!", _untagged)


def containers_from_yaml(text: bytes, name: str) -> Declared:
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.AliasEvent):
                raise IcechunkError(f"{name}: YAML aliases are not accepted in a repository config")
        doc = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as e:
        line = str(e).replace("\n", " ")
        raise IcechunkError(f"{name}: not valid YAML ({line})") from None
    if doc is None:
        return Declared()
    if not isinstance(doc, dict):
        raise IcechunkError(f"{name}: the repository config is not a YAML mapping")
    containers = doc.get("virtual_chunk_containers") or {}
    if not isinstance(containers, dict):
        raise IcechunkError(f"{name}: virtual_chunk_containers is not a mapping")
    found = []
    for key, value in containers.items():
        prefix = value.get("url_prefix", key) if isinstance(value, dict) else key
        if not isinstance(prefix, str) or not prefix:
            raise IcechunkError(f"{name}: a virtual chunk container without a URL prefix")
        found.append((value.get("name") if isinstance(value, dict) else None, prefix))
    return _declared(found, name)


def _map_get(m: Any, key: bytes, limit: int) -> Any:
    n = len(m)
    if n > limit:
        raise ValueError("a map longer than the buffer")
    keys = m.Keys
    for i in range(n):
        if keys[i].AsKeyBytes == key:
            return m.Values[i]
    return None


def containers_from_flexbuffer(data: bytes | bytearray, name: str) -> Declared:
    if not data:
        return Declared()
    if len(data) > MAX_CONFIG:
        raise IcechunkError(f"{name}: a repository config of more than {MAX_CONFIG:,} bytes")
    limit = len(data)
    try:
        root = flexbuffers.GetRoot(data)
        if not root.IsMap:
            raise IcechunkError(f"{name}: the repository config is not a FlexBuffers map")
        containers = _map_get(root.AsMap, b"virtual_chunk_containers", limit)
        if containers is None or containers.IsNull:
            return Declared()
        if not containers.IsMap:
            raise IcechunkError(f"{name}: virtual_chunk_containers is not a map")
        m = containers.AsMap
        n = len(m)
        if n > limit:
            raise ValueError("a map longer than the buffer")
        found = []
        for i in range(n):
            value = m.Values[i]
            prefix = _map_get(value.AsMap, b"url_prefix", limit) if value.IsMap else None
            if prefix is None or not prefix.IsString:
                raise IcechunkError(f"{name}: a virtual chunk container without a URL prefix")
            cname = _map_get(value.AsMap, b"name", limit)
            found.append((cname.AsString if cname is not None and cname.IsString else None,
                          prefix.AsString))
    except IcechunkError:
        raise
    except Exception as e:  # IndexError, struct.error, RecursionError...: all malformed input
        raise IcechunkError(f"{name}: a malformed FlexBuffers repository config "
                            f"({type(e).__name__})") from None
    return _declared(found, name)
