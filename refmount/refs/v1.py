"""Version 1 reference sets read: ``version``, ``templates``, ``gen`` and ``refs``, each
section streamed from SOURCE, the templates (``v1templates.py``) and ``gen`` entries
(``v1gen.py``) checked before any reference is made, then ``refs`` and ``gen`` added to the
index.

What a set makes is bounded before it is made where that can be known: the products of an
entry (``max_keys``), and the bytes of its keys from their templates' fixed text
(``max_generated``, ``max_key_length``). The rest is counted as it is made: batches of products
are sized in bytes, their keys checked and counted a batch at a time, a rendering as it ends.
"""

from __future__ import annotations

from typing import Any

import ijson

from refmount.refs.indexbuilder import IndexBuilder
from refmount.refs.jsonparse import Opener, json_error
from refmount.refs.limits import DEFAULT_LIMITS, JsonReader, Limits
from refmount.refs.model import ReferenceSetError
from refmount.refs.v1gen import GenEntry, check_generated, check_key_count
from refmount.refs.v1templates import RenderBudget, TemplateSet, Watchdog


def _read_section(open_stream: Opener, name: str, prefix: str, backend: Any, limits: Limits) -> Any:
    with open_stream() as f:
        try:
            for value in backend.items(JsonReader(f, name, limits), prefix, use_float=True):
                return value
        except ijson.JSONError as e:
            raise json_error(name, e) from None
    return None


def _refs_must_be_an_object(open_stream: Opener, name: str, backend: Any, limits: Limits) -> None:
    """Raise unless 'refs' is absent or an object (only 'gen' may then make references)."""
    with open_stream() as f:
        try:
            for prefix, event, _ in backend.parse(JsonReader(f, name, limits)):
                if prefix == "refs":
                    if event != "start_map":
                        raise ReferenceSetError(f"{name}: 'refs' must be an object of key: reference")
                    return
        except ijson.JSONError as e:
            raise json_error(name, e) from None


def read_v1(open_stream: Opener, name: str, builder: IndexBuilder, backend: Any = ijson,
            limits: Limits = DEFAULT_LIMITS) -> None:
    version = _read_section(open_stream, name, "version", backend, limits)
    if version not in (0, 1) or isinstance(version, bool):
        raise ReferenceSetError(f"{name}: unsupported reference set version {version!r} (expected 1, "
                                "or 0 with only 'refs')")
    raw_templates = _read_section(open_stream, name, "templates", backend, limits) or {}
    if not isinstance(raw_templates, dict):
        raise ReferenceSetError(f"{name}: 'templates' must be an object")
    gen = _read_section(open_stream, name, "gen", backend, limits) or []
    if not isinstance(gen, list):
        raise ReferenceSetError(f"{name}: 'gen' must be a list")
    if version == 0 and (raw_templates or gen):
        # {"version": 0, "refs": {...}}: a Version 0 set wrapped as kerchunk writes it
        raise ReferenceSetError(f"{name}: version 0 has no 'templates' or 'gen' (those are Version 1's)")
    watchdog = Watchdog(RenderBudget(limits.max_template_seconds))
    with watchdog.armed():
        templates = TemplateSet(raw_templates, name, watchdog)
        entries = [GenEntry(entry, i, templates) for i, entry in enumerate(gen)]
        check_key_count(name, entries, 0, limits.max_keys)  # refused before any work
        check_generated(name, entries, 0, limits, builder.bad_keys)
        builder.bound_generated(name)
        with open_stream() as f:
            try:
                add = builder.add_value
                render = templates.render_url
                n = 0
                for key, value in backend.kvitems(JsonReader(f, name, limits), "refs", use_float=True):
                    add(key, value, render)
                    n += 1
            except ijson.JSONError as e:
                raise json_error(name, e) from None
        if n == 0:  # kvitems yields nothing for a 'refs' that is not an object: say so
            _refs_must_be_an_object(open_stream, name, backend, limits)
        check_key_count(name, entries, builder.keys_read, limits.max_keys)
        builder.flush()  # the last keys of refs counted
        check_generated(name, entries, builder.generated, limits, builder.bad_keys)
        for entry in entries:
            entry.expand(builder)
__all__ = ["read_v1"]
