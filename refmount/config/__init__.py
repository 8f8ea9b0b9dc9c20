"""One configuration object, built from the command line / mount options.

A package of two modules: ``values.py`` (the kinds of values and their parsers) and
``options.py`` (the table and what is made from it); this module names what the rest of
refmount uses. It imports nothing of refmount but ``errors``, ``optionfile`` and ``urls``.

Every ``-o`` option is declared once, in :data:`OPTIONS`: its name, the kind of value it takes,
its default and one line of help. :class:`MountConfig` (its fields and defaults), the parsing of
``-o`` (:func:`apply_options`), ``refmount --help`` (:func:`options_help`) and the table of
``docs/configuration.md`` (:func:`options_markdown`, written by ``scripts/options_doc.py``) are
all made from that table. Nothing is read from module-level state at mount time. The object is
serialised to JSON to hand it to the detached daemon process over a pipe (never argv, so
secrets in ``remote_options`` stay out of ``ps``).
"""

from __future__ import annotations

from refmount.base.errors import ConfigError
from refmount.config.options import (
    IGNORED_OPTIONS,
    OPTIONS,
    OPTIONS_BY_NAME,
    MountConfig,
    apply_options,
    describe_options,
    did_you_mean,
    options_help,
    options_markdown,
)
from refmount.config.values import (
    DECODE_MAX_CHUNK_BYTES,
    MAX_RULES_FILE,
    Flag,
    Json,
    Option,
    Rules,
    default_cache_dir,
    format_size,
    json_option,
    parse_size,
    read_token,
    split_listen,
    split_options,
)

__all__ = [
    "DECODE_MAX_CHUNK_BYTES", "IGNORED_OPTIONS", "MAX_RULES_FILE", "OPTIONS", "OPTIONS_BY_NAME",
    "ConfigError", "Flag", "Json", "MountConfig", "Option", "Rules", "apply_options",
    "default_cache_dir", "describe_options", "did_you_mean", "format_size", "json_option",
    "options_help", "options_markdown", "parse_size", "read_token", "split_listen", "split_options",
]
