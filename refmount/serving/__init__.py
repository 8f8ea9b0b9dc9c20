"""serving: what a serving process needs before and around a set's core — preparing a set's
index (``preparation``), parsing SOURCE in a process of its own (``indexer``), where log lines
go (``logsetup``) and how a serving process says it is ready (``readiness``). Imports: the
layers below; never ``sets`` or a front end.
"""
