"""core: one reference set, serving bytes — the set's core built from its index (``setcore``),
the block store (memory, disk, fetch), the reader of a key's bytes, readahead within and across
keys, grid blocks, what is known of each target's size, and the consolidated metadata made from
the set. Imports: every layer below (``decode``, ``targets``, ``cache``, ``refs``, ``config``,
``base``); never ``sets``, ``serving`` or a front end.
"""
