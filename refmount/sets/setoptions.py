"""The options one set of a catalogue may have (PER_SET_OPTIONS), read from a list file or a STAC
asset and checked against ``config.OPTIONS``.
"""

from __future__ import annotations

import json
from typing import Any

from refmount.base.errors import CatalogError, ConfigError
from refmount.config import OPTIONS_BY_NAME, Flag, Json, did_you_mean, split_options

# Options a catalogue may give one set. The others apply to the whole mount (FUSE and
# permissions, caches, logging, serving) or are the operator's bounds on what a set may cost
# (max_*, allow_local), which a catalogue must not raise.
PER_SET_OPTIONS = frozenset({
    "remote_protocol", "remote_options", "target_options", "decode", "max_chunk_bytes",
    "timeout", "retries", "bad_keys", "whole_fetch_limit", "merge_gap",
})


def set_options(value: Any, where: str) -> dict[str, str]:
    """A set's options from a list file or STAC asset: ``"decode,timeout=30"`` or
    ``{"decode": true, "timeout": 30}``, validated, as name -> ``-o`` value ("" for a flag)."""
    if value is None:
        return {}
    pairs: list[tuple[str, Any, bool]] = []  # name, value, whether a value was written
    if isinstance(value, str):
        for item in split_options(value):
            name, sep, text = item.partition("=")
            pairs.append((name.strip(), text, bool(sep)))
    elif isinstance(value, dict):
        pairs = [(str(k), v, True) for k, v in value.items()]
    else:
        raise CatalogError(f"{where}: \"options\" must be text (\"decode,timeout=30\") or an "
                           "object")
    out: dict[str, str] = {}
    for name, raw, written in pairs:
        option = OPTIONS_BY_NAME.get(name)
        if option is None:
            raise CatalogError(f"{where}: unknown option {name!r}"
                               f"{did_you_mean(name, PER_SET_OPTIONS)}")
        if name not in PER_SET_OPTIONS:
            raise CatalogError(f"{where}: option {name!r} applies to the whole mount, not to one "
                               f"set (a set may have {', '.join(sorted(PER_SET_OPTIONS))})")
        if isinstance(option.kind, Flag):
            if raw is True or (not written):
                out[name] = ""
                continue
            if raw is False:
                continue
            raise CatalogError(f"{where}: option {name!r} takes no value (true or false in an "
                               "object)")
        if not written:
            raise CatalogError(f"{where}: option {name!r} needs a value ({option.spec})")
        if isinstance(raw, bool) or raw is None:
            raise CatalogError(f"{where}: option {name!r} needs a value ({option.spec})")
        if isinstance(option.kind, Json):
            if isinstance(raw, dict):
                text = json.dumps(raw)
            elif isinstance(raw, str) and not raw.startswith("@"):
                text = raw
            else:  # @FILE would read a file the catalogue names: refused
                raise CatalogError(f"{where}: option {name!r} must be a JSON object given "
                                   "inline in a catalogue")
        elif isinstance(raw, (str, int, float)):
            text = str(raw)
        else:
            raise CatalogError(f"{where}: option {name!r} must be text or a number")
        try:
            option.kind.parse(name, text)
        except ConfigError as e:
            raise CatalogError(f"{where}: {e}") from None
        out[name] = text
    return out
