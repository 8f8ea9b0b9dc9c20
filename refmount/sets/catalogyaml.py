"""A catalogue's YAML list file read into Python values, from libyaml's events, bounded: no
aliases, no nesting deeper than MAX_NESTING, one document (``sets/catalog.py`` reads the list).
"""

from __future__ import annotations

from typing import Any

from refmount.base.errors import CatalogError

MAX_NESTING = 64  # of a YAML list file (a JSON one is orjson's: 1024)
YAML_TRUE = frozenset({"true", "yes", "on"})
YAML_FALSE = frozenset({"false", "no", "off"})
YAML_NULL = frozenset({"", "~", "null"})


def load_yaml(data: bytes) -> Any:
    """One YAML document, built from libyaml's events (PyYAML's resolver and constructor take
    seconds a megabyte): mappings, sequences and scalars, a plain scalar ``true``/``yes``/
    ``on`` (``false``/``no``/``off``, ``null``/``~``/empty) read as a boolean (None), every other
    scalar as text (options are text anyway). Tags are ignored; aliases (a YAML bomb repeats a
    subtree through them), nesting deeper than MAX_NESTING, keys that are not scalars and a
    second document are refused."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    stack: list[tuple[Any, Any]] = []  # (container, pending mapping key or _NO_KEY)
    root: list[Any] = []
    documents = 0

    def put(value: Any) -> None:
        if not stack:
            root.append(value)
            return
        container, key = stack[-1]
        if isinstance(container, list):
            container.append(value)
        elif key is _NO_KEY:
            if isinstance(value, (dict, list)):
                raise CatalogError("a YAML mapping key must be a scalar")
            stack[-1] = (container, "" if value is None else str(value))
        else:
            container[key] = value
            stack[-1] = (container, _NO_KEY)

    try:
        for event in yaml.parse(data, Loader=loader):
            if isinstance(event, yaml.ScalarEvent):
                value: Any = event.value
                if event.implicit[0] and not event.style:  # plain (libyaml: "", PyYAML: None)
                    low = value.lower()
                    value = (True if low in YAML_TRUE else False if low in YAML_FALSE
                             else None if low in YAML_NULL else value)
                put(value)
            elif isinstance(event, (yaml.MappingStartEvent, yaml.SequenceStartEvent)):
                if len(stack) >= MAX_NESTING:
                    raise CatalogError(f"nested deeper than {MAX_NESTING} levels (line "
                                       f"{event.start_mark.line + 1})")
                container: Any = {} if isinstance(event, yaml.MappingStartEvent) else []
                put(container)
                stack.append((container, _NO_KEY))
            elif isinstance(event, (yaml.MappingEndEvent, yaml.SequenceEndEvent)):
                stack.pop()
            elif isinstance(event, yaml.AliasEvent):
                raise CatalogError(f"YAML aliases are not allowed in a catalogue (line "
                                   f"{event.start_mark.line + 1})")
            elif isinstance(event, yaml.DocumentStartEvent):
                documents += 1
                if documents > 1:
                    raise CatalogError("more than one YAML document")
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark is not None else ""
        raise CatalogError(f"not valid YAML{where}") from None
    return root[0] if root else None


_NO_KEY = object()  # a mapping waiting for its next key
