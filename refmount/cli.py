"""Command line: ``refmount SOURCE MOUNTPOINT [-o opt[,opt...]] [-f] [-d]``.

Loading and validating the references happens before anything is mounted, so that a bad
reference set is reported on stderr with a non-zero exit and no mount is left. By default
the parse runs here, then a fresh daemon process is started (not forked: the parser's heap
and threads stay behind) and we return 0 once it reports that the mount answers. With
``-f`` this process serves, and the parse runs in a child process (indexer.py).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import select
import subprocess
import sys
import tempfile
import time

from . import __version__
from .config import MountConfig, apply_options, options_help, split_options
from .errors import ConfigError, MountError
from .mountpoint import check_mountpoint, recover_stale_mount
from .policy import TargetRefused, check_targets
from .redact import RedactingFormatter, redact_url
from .refs import IndexFile, ReferenceSetError, format_named, prepare_index
from .refs.limits import Limits
from .spawn import child_env, module_command
from .urls import is_local, local_path

log = logging.getLogger("refmount")

READY_TIMEOUT = 120.0


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="refmount",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount a kerchunk reference set (Version 0/1 JSON, or a Parquet "
        "reference directory) as a read-only directory tree.",
        epilog=f"mount options (-o):\n{options_help()}\n\n"
        "Sizes take K, M, G, T suffixes (powers of 1024).\n"
        "Other commands: refmount expand SOURCE [-o OUT] | refmount inspect SOURCE [--json] | "
        "refmount stats MOUNTPOINT [--json]\n\n"
        "Generic mount options (ro, nodev, nosuid, _netdev, noauto, x-systemd.*, ...) are "
        "accepted and ignored.\nUnmount with: fusermount3 -u MOUNTPOINT",
    )
    p.add_argument("source", metavar="SOURCE", help="reference set: local path or fsspec URL "
                   "(.gz/.bz2/.xz/.zst compression inferred from the name)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", help="an existing directory")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="mount options, see below")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground (log to stderr unless log= says otherwise)")
    p.add_argument("-d", "--debug", action="store_true",
                   help="foreground with debug logging (implies -f)")
    p.add_argument("--version", action="version", version=f"refmount {__version__}")
    return p


def config_from_args(args: argparse.Namespace) -> MountConfig:
    source = args.source
    if is_local(source):  # the daemon runs in "/": a local SOURCE is made absolute here
        source = os.path.abspath(local_path(source))
    cfg = MountConfig(source=source, mountpoint=os.path.abspath(args.mountpoint))
    apply_options(cfg, [o for group in args.options for o in split_options(group)])
    if args.debug:
        cfg.debug = True
        cfg.log_level = "debug"
        cfg.foreground = True
    if args.foreground:
        cfg.foreground = True
    return cfg


SUBCOMMANDS = ("expand", "inspect", "stats")


def _tool_parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"refmount {command}")
    if command == "stats":
        p.description = "Show the counters of a mounted reference set."
        p.add_argument("mountpoint", metavar="MOUNTPOINT")
    else:
        p.add_argument("source", metavar="SOURCE", help="reference set (path or fsspec URL)")
        p.add_argument("--target-options", default="{}", metavar="JSON|@FILE",
                       help="fsspec storage options for opening SOURCE")
    if command == "expand":
        p.description = ("Write the Version 0 JSON equivalent of any reference set "
                         "(Version 0/1 JSON or Parquet), streaming.")
        p.add_argument("-o", "--output", default="-", metavar="OUT",
                       help="output path or fsspec URL (.gz/.zst compressed by name); default stdout")
    if command == "inspect":
        p.description = "Summarise a reference set without mounting it."
    if command in ("inspect", "stats"):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _run_tool(command: str, argv: list[str]) -> int:
    import fsspec

    from . import tools
    from .config import _json_option

    args = _tool_parser(command).parse_args(argv)
    if command == "stats":
        stats = tools.read_stats(os.path.abspath(args.mountpoint))
        print(json.dumps(stats, indent=2) if args.json else tools.format_stats(stats))
        return 0
    options = _json_option("--target-options", args.target_options)
    source = os.path.abspath(local_path(args.source)) if is_local(args.source) else args.source
    if command == "inspect":
        info = tools.inspect(source, options)
        print(json.dumps(info, indent=2) if args.json else tools.format_inspect(info))
        return 0
    if args.output == "-":
        n = tools.expand(source, sys.stdout, options)
    else:
        with fsspec.open(args.output, "wt", compression="infer", encoding="utf-8") as out:
            n = tools.expand(source, out, options)
    print(f"refmount: wrote {n:,} keys", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in SUBCOMMANDS:
            _stderr_warnings()
            return _run_tool(argv[0], argv[1:])
        args = _parser().parse_args(argv)
        return _run(args)
    except (ReferenceSetError, ConfigError, RuntimeError) as e:
        return _fail(str(e))
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return _fail("interrupted")
    except Exception as e:  # never a traceback for bad input: one line, non-zero exit
        log.debug("unexpected error", exc_info=True)
        return _fail(f"unexpected {type(e).__name__}: {e}")


def _run(args: argparse.Namespace) -> int:
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        return _fail(str(e))
    # Until the daemon takes over, warnings (e.g. skipped keys) go to stderr.
    _stderr_warnings()
    if cfg.foreground:
        return _run_foreground(cfg)
    launcher = None
    index_file: IndexFile | None = None
    try:
        if cfg.recover:
            recover_stale_mount(cfg.mountpoint)
        check_mountpoint(cfg.mountpoint)
        launcher = DaemonLauncher(cfg.mountpoint)
        index_file = index_source(cfg)
        check_index_targets(cfg, index_file)
        if cfg.decode:
            _warn_not_decoded(cfg, index_file)
    except BaseException as e:
        if launcher is not None:
            launcher.abort()
        if index_file is not None:
            _remove_temporary(index_file)  # it holds every target URL of the refused set
        if isinstance(e, ReferenceSetError | MountError | TargetRefused):
            return _fail(str(e))
        if isinstance(e, MemoryError):
            return _fail(f"{cfg.source}: out of memory while indexing the reference set")
        raise
    return launcher.hand_over(cfg, index_file)


def _run_foreground(cfg: MountConfig) -> int:
    """``-f``: this process serves, from an index that a child process parsed (see
    indexer.py), so that it never holds the parser's heap."""
    from .indexer import Indexer, IndexerError

    try:
        if cfg.recover:
            recover_stale_mount(cfg.mountpoint)
        check_mountpoint(cfg.mountpoint)
    except MountError as e:
        return _fail(str(e))
    indexer = Indexer(cfg)
    try:
        from .daemon import serve, setup_logging  # imported while the child parses
    except BaseException:
        indexer.kill()
        raise
    try:
        index_file = indexer.result()
    except IndexerError as e:
        return _fail(str(e))
    setup_logging(cfg, detached=False)
    try:
        return serve(cfg, index_file, on_ready=lambda: None)
    except MountError as e:
        return _fail(str(e))
    finally:
        _remove_temporary(index_file)  # serve() removes it once mapped; not if it failed before


def index_source(cfg: MountConfig) -> IndexFile:
    """Parse or validate SOURCE in its format (refs.prepare_index) under the mount's limits."""
    return prepare_index(cfg.source, cfg.target_options, bad_keys=cfg.bad_keys,
                         limits=Limits.from_config(cfg),
                         cache_dir=cfg.cache_dir if cfg.disk_cache else None)


def check_index_targets(cfg: MountConfig, index_file: IndexFile) -> None:
    """Refuse the set if a target known before mounting may not be read (TargetRefused)."""
    check_targets(cfg, format_named(index_file.kind).targets(index_file))


def _warn_not_decoded(cfg: MountConfig, index_file: IndexFile) -> None:
    """With ``-o decode``, the arrays served as referenced are named here on stderr too: a
    detached daemon's warnings go to its log."""
    from .decoded import DecodedView

    metadata = format_named(index_file.kind).metadata(index_file, cfg.source, cfg.target_options,
                                                      bad_keys=cfg.bad_keys)
    DecodedView.from_index(metadata, cfg.max_chunk_bytes).warn()


def _remove_temporary(index_file: IndexFile) -> None:
    if index_file.temporary:
        with contextlib.suppress(OSError):
            os.unlink(index_file.path)


def _stderr_warnings() -> None:
    """Until a daemon takes over, warnings (skipped keys, stale mounts) go to stderr."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(RedactingFormatter("refmount: %(levelname)s: %(message)s"))
    logging.basicConfig(level=logging.WARNING, handlers=[handler])


def _fail(message: str) -> int:
    # Messages name SOURCE or targets, which may carry credentials: never print those.
    print(f"refmount: error: {redact_url(message)}", file=sys.stderr)
    return 1


class DaemonLauncher:
    """Starts the daemon process *before* the references are parsed, so that its imports
    (pyarrow, fsspec, aiohttp, trio, pyfuse3: most of a second) overlap the parsing. It
    waits for its configuration on stdin; closing stdin without one makes it exit."""

    def __init__(self, mountpoint: str) -> None:
        self._read_fd, write_fd = os.pipe()
        self._errlog = tempfile.TemporaryFile()  # noqa: SIM115 (closed in _close)
        self.proc = subprocess.Popen(
            module_command("refmount.daemon", "--ready-fd", str(write_fd), mountpoint),
            env=child_env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=self._errlog,
            pass_fds=(write_fd,),
            start_new_session=True,
        )
        os.close(write_fd)

    def abort(self) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self._close()

    def _close(self) -> None:
        with contextlib.suppress(OSError):
            os.close(self._read_fd)
        self._errlog.close()

    def hand_over(self, cfg: MountConfig, index_file: IndexFile) -> int:
        """Send the configuration, wait until the mount answers; 0 or a reported failure."""
        assert self.proc.stdin is not None
        payload = {"config": vars(cfg), "index": vars(index_file)}
        try:
            self.proc.stdin.write(json.dumps(payload).encode())
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # it died early; its stderr says why
        message = _read_ready(self._read_fd, READY_TIMEOUT)
        try:
            if message == "READY":
                return 0
            return self._failed(message, index_file)
        finally:
            self._close()

    def _failed(self, message: str | None, index_file: IndexFile) -> int:
        # Make sure the daemon is gone and left nothing behind.
        if message is None:
            self.proc.terminate()
        try:
            code = self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        _remove_temporary(index_file)
        if message and message.startswith("ERROR "):
            return _fail(message[6:])
        self._errlog.seek(0)
        tail = [ln for ln in self._errlog.read().decode(errors="replace").splitlines() if ln.strip()]
        why = tail[-1] if tail else f"exit status {code}"
        if message is None:
            return _fail(f"the mount did not answer within {READY_TIMEOUT:g} s ({why})")
        return _fail(f"daemon exited during start-up: {why}")


def _read_ready(fd: int, timeout: float) -> str | None:
    """The daemon's one-line report; '' on EOF without a report; None on timeout."""
    deadline = time.monotonic() + timeout
    buf = b""
    while b"\n" not in buf:
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            break
        buf += chunk
    return buf.split(b"\n", 1)[0].decode(errors="replace")
