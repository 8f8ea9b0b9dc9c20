"""Helpers shared by the test modules: data sets, servers, mounts through the CLI, reading a
mounted tree back. conftest.py puts tests/ on ``sys.path``, so they import as ``support.*``.
Test modules import from here (and get fixtures from conftest.py), never from each other."""
