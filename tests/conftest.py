"""Fixtures for real-mount tests of refmount.

- ``datasets`` (session): real netCDF4/HDF5 + netCDF3 files and kerchunk refs (see support/datasets.py),
  with http variants pointing at ``nginx``.
- ``nginx`` (session): Debian nginx on 127.0.0.1 serving the dataset directory (support/servers.py).
- ``mount`` (function): factory ``mount(source, *opts, mnt=None) -> Mount`` running the CLI in
  daemon mode; asserts exit 0 and that the mount is there; ALWAYS unmounts at teardown and waits
  for the daemon to exit (killing only that daemon's PID if it does not).
- ``shared_mounts`` (session): ``shared_mounts.get(name)`` mounts ``datasets.refs[name]`` once
  per session, for read-only checks.
- ``mount_fails`` (function): runs the CLI expecting failure, and checks the error contract (exit
  non-zero, one ``refmount: error:`` line on stderr, no mount, no daemon left).

Every daemon logs to a file (``-o log=...,log_level=debug``); a failing test gets the log of
every mount it used appended to its report. A watchdog kills the test's daemons shortly before
the test's timeout, so a hung FUSE request turns into ENOTCONN instead of a hung suite.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
import threading
from collections import Counter
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))  # tests/support/ imports as ``support``

from support.datasets import Datasets, build
from support.faultserver import serving
from support.mounts import (
    LIVE_MOUNTERS,
    FailingMounter,
    Mount,
    Mounter,
    SharedMounts,
    mount_entries,
    warn_problems,
)
from support.servers import NginxServer
from support.serving import Servers

# --- marks --------------------------------------------------------------------------------------


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "fuse: needs /dev/fuse and fusermount3 (fails, never skips, without them)"
    )
    config.addinivalue_line(
        "markers", "long(seconds): a module taking about that long on a quiet machine;"
        " scheduled before the others, the longest first"
    )


def pytest_collection_modifyitems(config, items):
    """Modules marked ``long(seconds)`` first, longest first, then the others by their number
    of tests (most first), each module's tests in their own order. ``scripts/test.sh`` runs the
    mount tier with ``--dist loadfile --no-loadscope-reorder``, so each module runs whole on
    one of two workers in this order: a long module started last would leave the other worker
    idle while it ends (pytest-xdist's own order, by number of tests, puts the one-test
    modules last)."""
    count = Counter(item.path for item in items)
    seconds = {}
    for item in items:
        mark = item.get_closest_marker("long")
        seconds[item.path] = mark.args[0] if mark else 0
    items.sort(key=lambda item: (-seconds[item.path], -count[item.path]))


# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def datasets(tmp_path_factory, nginx_root) -> Datasets:
    return build(nginx_root)


@pytest.fixture(scope="session")
def nginx_root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("served")


@pytest.fixture(scope="session")
def nginx(tmp_path_factory, nginx_root):
    srv = NginxServer(nginx_root, run_dir=tmp_path_factory.mktemp("nginx-run"))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="session")
def http_datasets(datasets, nginx) -> Datasets:
    """``datasets`` with the ``*_http`` reference sets written (nginx serves ``datasets.root``)."""
    if datasets.http_base != nginx.url:
        datasets.add_http_refs(nginx.url)
    return datasets


@pytest.fixture(scope="session")
def shared_mounts(tmp_path_factory, http_datasets):
    mounter = Mounter(tmp_path_factory.mktemp("shared-mounts"))
    LIVE_MOUNTERS.append(mounter)
    try:
        yield SharedMounts(mounter, http_datasets)
    finally:
        LIVE_MOUNTERS.remove(mounter)
        warn_problems("shared mounts", mounter.cleanup())


@pytest.fixture
def mount(tmp_path):
    """Factory: ``mount(source, *opts, mnt=None) -> Mount`` (daemon mode, asserted to work)."""
    mounter = Mounter(tmp_path / "mounts")
    LIVE_MOUNTERS.append(mounter)
    try:
        yield mounter
    finally:
        LIVE_MOUNTERS.remove(mounter)
        warn_problems("mount", mounter.cleanup())


@pytest.fixture
def serve(tmp_path):
    """Factory: ``serve(source, *opts) -> Served`` (``refmount serve``, detached, on a free
    loopback port, asserted to start); every server is stopped at teardown."""
    servers = Servers(tmp_path / "serve-logs")
    try:
        yield servers
    finally:
        servers.cleanup()


@pytest.fixture
def mount_fails(tmp_path):
    """Factory: ``mount_fails(source, *opts, must_mention=(), mnt=None) -> (CliResult, line)``.

    Runs the CLI (daemon mode) expecting failure and checks the error contract (see
    ``assert_cli_error``). Should the CLI wrongly succeed, the mount is cleaned up at teardown."""
    mounter = FailingMounter(tmp_path / "failmounts")
    LIVE_MOUNTERS.append(mounter)
    try:
        yield mounter
    finally:
        LIVE_MOUNTERS.remove(mounter)
        warn_problems("mount_fails", mounter.cleanup())


@pytest.fixture(autouse=True)
def _fuse_watchdog(request):
    """Kill this session's daemons shortly before the test's timeout: a hung FUSE request then
    fails with ENOTCONN and the test (and its teardown) can finish instead of hanging."""
    marker = request.node.get_closest_marker("timeout")
    timeout = float(marker.args[0]) if marker and marker.args else float(
        request.config.getini("timeout") or 300)
    fired = threading.Event()

    def fire():
        fired.set()
        for mounter in list(LIVE_MOUNTERS):
            for m in mounter.mounts:
                m.refresh_procs()
                m.kill_daemons()

    timer = threading.Timer(max(timeout - 10, timeout * 0.8), fire)
    timer.daemon = True
    timer.start()
    yield
    timer.cancel()
    if fired.is_set():
        pytest.fail("watchdog fired: the test hung on the mount; daemons were killed",
                    pytrace=False)


# --- logs of the mounts a failing test used -----------------------------------------------------


def _mounts_in(obj) -> list[Mount]:
    if isinstance(obj, Mount):
        return [obj]
    if isinstance(obj, Mounter | SharedMounts):
        return list(obj.mounts)
    return []


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    seen = set()
    funcargs = getattr(item, "funcargs", {}) or {}
    for value in funcargs.values():
        for m in _mounts_in(value):
            if m.path in seen:
                continue
            seen.add(m.path)
            report.sections.append((f"refmount daemon log {m.path}", m.log_text(tail=80)))


@pytest.fixture
def public(mount):
    """A directory every user can traverse (pytest's tmp dirs are 0700), for sources and
    mountpoints that ``nobody`` must reach. Its mounts are cleaned up before it is removed."""
    base = Path(tempfile.mkdtemp(prefix="refmount-confine-", dir="/tmp"))
    base.chmod(0o755)
    mount.base.mkdir(parents=True, exist_ok=True)  # logs of mounts with an explicit mnt=
    try:
        yield base
    finally:
        mount.cleanup()
        if not any(e[1].startswith(str(base) + "/") for e in mount_entries()):
            shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def srv(tmp_path):
    """The fault-injecting HTTP server (tests/support/faultserver.py) on 127.0.0.1."""
    with serving(tmp_path / "served") as s:
        yield s


@pytest.fixture(scope="session")
def system_install():
    """refmount installed for system use by scripts/install.sh, once per session, and
    uninstalled at the end if the session installed it (support.admin.system_install)."""
    from support.admin import system_install as install

    with install() as installation:
        yield installation
