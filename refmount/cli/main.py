"""Command line: ``refmount SOURCE MOUNTPOINT [-o opt[,opt...]] [-f] [-d]``.

Loading and validating the references happens before anything is mounted, so that a bad
reference set is reported on stderr with a non-zero exit and no mount is left. By default
the parse runs here, then a fresh daemon process is started (not forked: the parser's heap
and threads stay behind) and we return 0 once it reports that the mount answers. With
``-f`` this process serves, and the parse runs in a child process (serving/indexer.py).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import MutableMapping
from typing import NoReturn

import refmount
from refmount.base.errors import ConfigError, MountError
from refmount.base.process import ignore_user_signals
from refmount.base.urls import is_local, local_path
from refmount.cache.directory import check_cache_dir
from refmount.cli.cmdline import ENV_OPTIONS, ENV_SOURCE, hide_credentials, take_configuration
from refmount.cli.launch import DaemonLauncher, fail, serve_detached, serve_in_foreground
from refmount.config import MountConfig, apply_options, did_you_mean, options_help, split_options
from refmount.fuse.mountpoint import check_mountpoint, recover_stale_mount
from refmount.refs import ReferenceSetError
from refmount.serving.logsetup import stderr_warnings
from refmount.targets.pinhandover import hand_over_pins
from refmount.targets.policy import TargetRefused

log = logging.getLogger("refmount")



class _Parser(argparse.ArgumentParser):
    """argparse, with ``--decode`` (an option given as a flag) answered "did you mean
    '-o decode'?"."""

    def error(self, message: str) -> NoReturn:
        from refmount.config import OPTIONS_BY_NAME

        prefix = "unrecognized arguments: "
        if message.startswith(prefix):
            for word in message[len(prefix):].split():
                name = word.lstrip("-").partition("=")[0].replace("-", "_")
                if word.startswith("--") and name in OPTIONS_BY_NAME:
                    value = word.partition("=")[2]
                    message += f": did you mean '-o {name}{'=' + value if value else ''}'?"
                    break
        super().error(message)


def _parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="refmount",
        usage="%(prog)s [-f] [-d] [-o OPT[,OPT...]] SOURCE MOUNTPOINT\n"
              "       %(prog)s --env [-f] [-d] [-o OPT[,OPT...]] MOUNTPOINT",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Mount a kerchunk reference set (Version 0/1 JSON, or a Parquet "
        "reference directory) or an Icechunk repository (-o branch=, tag=, snapshot=) as a "
        "read-only directory tree; 'refmount serve SOURCE' serves the same tree over HTTP.",
        epilog=f"mount options (-o):\n{options_help()}\n\n"
        "Sizes take K, M, G, T suffixes (powers of 1024).\n"
        "Other commands: refmount serve SOURCE [--listen HOST:PORT] [-o OPT...] | "
        "refmount expand SOURCE [-o OUT] | refmount inspect SOURCE [--json] | "
        "refmount stats MOUNTPOINT [--json] | refmount verify SOURCE [--pin FILE] [--json]\n\n"
        "Generic mount options (ro, nodev, nosuid, _netdev, noauto, x-systemd.*, ...) are "
        "accepted and ignored.\nUnmount with: fusermount3 -u MOUNTPOINT",
    )
    p.add_argument("source", metavar="SOURCE", nargs="?", help="reference set: local path or "
                   "fsspec URL (.gz/.bz2/.xz/.zst compression inferred from the name)")
    p.add_argument("mountpoint", metavar="MOUNTPOINT", nargs="?", help="an existing directory")
    p.add_argument("--env", action="store_true",
                   help=f"take SOURCE from ${ENV_SOURCE} and mount options from ${ENV_OPTIONS} "
                   "(then give only MOUNTPOINT): nothing of the configuration on the command "
                   "line, which every user can read")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="mount options, see below")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="stay in the foreground (log to stderr unless log= says otherwise)")
    p.add_argument("-d", "--debug", action="store_true",
                   help="foreground with debug logging (implies -f)")
    p.add_argument("--version", action="version", version=f"refmount {refmount.__version__}")
    return p


def config_from_args(args: argparse.Namespace,
                     environ: MutableMapping[str, str] = os.environ) -> MountConfig:
    """The mount's configuration from the command line; with ``--env``, SOURCE and the options
    from ``environ`` first (taken out of it: the processes started later get the configuration
    on stdin), then the command line's ``-o`` options."""
    source, mountpoint, options = args.source, args.mountpoint, []
    if getattr(args, "env", False):
        if mountpoint is not None:
            raise ConfigError(f"with --env, give only MOUNTPOINT: SOURCE is ${ENV_SOURCE}")
        mountpoint = source
        source, options = take_configuration(environ)
        if source is None:
            raise ConfigError(f"--env: ${ENV_SOURCE} is not set (the reference set to mount)")
    if source is None or mountpoint is None:
        raise ConfigError("SOURCE and MOUNTPOINT are required (see refmount --help)")
    if is_local(source):  # the daemon runs in "/": a local SOURCE is made absolute here
        source = os.path.abspath(local_path(source))
    cfg = MountConfig(source=source, mountpoint=os.path.abspath(mountpoint))
    apply_command_options(cfg, options + [o for group in args.options for o in split_options(group)])
    _foreground_flags(cfg, args)
    return cfg


SUBCOMMANDS = ("expand", "inspect", "stats", "verify")


def apply_command_options(cfg: MountConfig, options: list[str]) -> None:
    """``-o`` options onto ``cfg``: the option table reads each value, and the layer that a value
    means something to checks it (target rules, CORS origins), so that a bad one stops the
    command before anything starts."""
    apply_options(cfg, options)
    if cfg.targets != []:
        from refmount.targets.rules import check_rules

        cfg.targets = check_rules(cfg.targets)
    if cfg.cors is not None:
        from refmount.http.cors import cors_problem

        if (problem := cors_problem(cfg.cors)) is not None:
            raise ConfigError(problem)


def _foreground_flags(cfg: MountConfig, args: argparse.Namespace) -> None:
    """``-d`` (foreground with debug logging) and ``-f``."""
    if args.debug:
        cfg.debug = True
        cfg.log_level = "debug"
        cfg.foreground = True
    if args.foreground:
        cfg.foreground = True


def _serve_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="refmount serve",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve a kerchunk reference set over HTTP: the tree a mount shows, read-only "
        "(GET/HEAD with ranges, directory listings, a .zmetadata at the root). Detached, prints "
        "the base URL and the server's process id once it answers; stop it with kill PID.",
        epilog=f"options (-o), the same as a mount's:\n{options_help()}",
    )
    p.add_argument("source", metavar="SOURCE", nargs="?",
                   help="reference set: local path or fsspec URL")
    p.add_argument("--env", action="store_true",
                   help="SOURCE and options from $REFMOUNT_SOURCE and $REFMOUNT_OPTIONS (kept off "
                   "the command line, where every user sees them)")
    p.add_argument("--listen", metavar="HOST:PORT", default=None,
                   help="address to listen on (default 127.0.0.1:8080; port 0: any free port)")
    p.add_argument("--s3-listen", metavar="[HOST:]PORT", default=None,
                   help="also serve the set (a catalogue's sets) as S3 buckets, read-only, path-style, "
                   "on this address (HOST defaults to 127.0.0.1)")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="options, see below")
    p.add_argument("-f", "--foreground", action="store_true",
                   help="serve in the foreground (log to stderr unless log= says otherwise)")
    p.add_argument("-d", "--debug", action="store_true", help="foreground with debug logging")
    return p


def serve_config(args: argparse.Namespace,
                 environ: MutableMapping[str, str] = os.environ) -> MountConfig:
    """The server's configuration; with ``--env``, SOURCE and the options from ``environ``
    first (taken out of it), then the command line's ``-o`` options."""
    source, options = args.source, []
    if args.env:
        if source is not None:
            raise ConfigError(f"with --env, give no SOURCE: it is ${ENV_SOURCE}")
        source, options = take_configuration(environ)
        if source is None:
            raise ConfigError(f"--env: ${ENV_SOURCE} is not set (the reference set to serve)")
    if source is None:
        raise ConfigError("SOURCE is required (see refmount serve --help)")
    if is_local(source):
        source = os.path.abspath(local_path(source))
    cfg = MountConfig(source=source, mountpoint="", serving=True)
    apply_command_options(cfg, options + [o for group in args.options for o in split_options(group)])
    if args.listen is not None:
        apply_options(cfg, [f"listen={args.listen}"])
    if getattr(args, "s3_listen", None) is not None:
        s3 = args.s3_listen if ":" in args.s3_listen else f"127.0.0.1:{args.s3_listen}"
        apply_options(cfg, [f"s3_listen={s3}"])
    _foreground_flags(cfg, args)
    return cfg


def _run_serve(argv: list[str]) -> int:
    args = _serve_parser().parse_args(argv)
    try:
        cfg = serve_config(args)
    except ConfigError as e:
        return fail(str(e))
    stderr_warnings()

    def checks() -> None:
        hand_over_pins(cfg)  # parsed once, its table handed to what serves
        if cfg.disk_cache:
            check_cache_dir(cfg.cache_dir)  # before anything is written there

    if cfg.foreground:
        return serve_in_foreground(cfg, checks, "refmount.http.daemon", lambda serving, index_file, _: (
            serving.serve(cfg, index_file, on_ready=lambda url: print(url, os.getpid(), flush=True))))
    return serve_detached(cfg, checks, lambda: DaemonLauncher(cfg.listen, module="refmount.http.daemon"),
                           on_ready=lambda what: print(what, flush=True))


VERIFY_JOBS = 32  # targets asked at once by refmount verify, by default


def _verify_parser() -> argparse.ArgumentParser:
    p = _Parser(
        prog="refmount verify",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Check every distinct target of a reference set once: missing, forbidden, "
        "shorter than the furthest byte a reference reads, or (with -o pins=FILE) not the pinned "
        "version. Prints the targets with a problem and a summary line. Exit status: 0 all "
        "targets ok, 1 some are not, 2 the set could not be verified (bad option or set).",
        epilog=f"options (-o), a mount's (the target policy, remote_options, timeout, retries "
        f"and max_connections apply as at a mount):\n{options_help()}",
    )
    p.add_argument("source", metavar="SOURCE", help="reference set: local path or fsspec URL")
    p.add_argument("-o", dest="options", action="append", default=[], metavar="OPT[,OPT...]",
                   help="options, see below")
    p.add_argument("--json", action="store_true",
                   help="print one JSON object (every target with its status) instead of a table")
    p.add_argument("--pin", metavar="FILE",
                   help="write each sound target's size and ETag / modification time to FILE "
                   "(JSON, replaced atomically), for mounting with -o pins=FILE")
    p.add_argument("-j", "--jobs", type=int, default=VERIFY_JOBS, metavar="N",
                   help=f"targets asked at once (default {VERIFY_JOBS})")
    return p


def _run_verify(argv: list[str]) -> int:
    """``refmount verify``: exit 0 when every target is ok, 1 when one is not, 2 when the
    set could not be verified (its one ``refmount: error:`` line says why)."""
    from refmount.sets import verify
    from refmount.targets.pins import write_pins

    args = _verify_parser().parse_args(argv)
    try:
        if not 1 <= args.jobs <= 10_000:
            raise ConfigError(f"--jobs must be from 1 to 10000, got {args.jobs}")
        source = args.source
        if is_local(source):
            source = os.path.abspath(local_path(source))
        cfg = MountConfig(source=source, mountpoint="")
        apply_command_options(cfg, [o for group in args.options for o in split_options(group)])
        reports = verify.verify_set(cfg, jobs=args.jobs)
        if args.pin:
            n = write_pins(args.pin, verify.pinnable(reports), cfg.source)
            print(f"refmount: pinned {n:,} targets in {args.pin}", file=sys.stderr)
    except (ConfigError, ReferenceSetError, TargetRefused, MountError) as e:
        fail(str(e))
        return 2
    except OSError as e:  # the pin file cannot be written
        fail(f"{args.pin}: {e.strerror or e}")
        return 2
    print(verify.report_json(reports, cfg.source) if args.json else verify.format_report(reports))
    return verify.exit_status(reports)


def _tool_parser(command: str) -> argparse.ArgumentParser:
    p = _Parser(prog=f"refmount {command}")
    if command == "stats":
        p.description = ("Show the counters of a mounted reference set, or of a refmount serve "
                         "server given its base URL.")
        p.add_argument("mountpoint", metavar="MOUNTPOINT|URL")
    else:
        p.add_argument("source", metavar="SOURCE", help="reference set (path or fsspec URL)")
        p.add_argument("--target-options", default="{}", metavar="JSON|@FILE",
                       help="fsspec storage options for opening SOURCE")
        if command in ("expand", "inspect"):
            p.add_argument("--format", default=None, choices=("json", "parquet", "icechunk"),
                           help="SOURCE's format (default: found by its layout)")
            for name, what in (("branch", "NAME"), ("tag", "NAME"), ("snapshot", "ID")):
                p.add_argument(f"--{name}", default=None, metavar=what,
                               help=f"an Icechunk repository: the {name} to read (default: branch main)")
    if command == "expand":
        p.description = ("Write the Version 0 JSON equivalent of any reference set "
                         "(Version 0/1 JSON or Parquet), streaming.")
        p.add_argument("-o", "--output", default="-", metavar="OUT",
                       help="output path or fsspec URL (.gz/.zst compressed by name); default stdout")
    if command == "inspect":
        p.description = "Summarise a reference set without mounting it."
        p.add_argument("--targets", default=None, metavar="JSON|@FILE",
                       help="target rules (as -o targets=): show where targets are read and "
                            "which no rule matches")
        p.add_argument("-o", dest="options", action="append", default=[], metavar="NAME=VALUE",
                       help="as a mount takes it: branch=NAME, tag=NAME or snapshot=ID")
    if command in ("inspect", "stats"):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def _run_tool(command: str, argv: list[str]) -> int:
    import fsspec

    from refmount.cli import tools
    from refmount.config import json_option

    args = _tool_parser(command).parse_args(argv)
    if command == "stats":
        if args.mountpoint.startswith(("http://", "https://")):
            stats = tools.read_server_stats(args.mountpoint)
        else:
            stats = tools.read_stats(os.path.abspath(args.mountpoint))
        print(json.dumps(stats, indent=2) if args.json else tools.format_stats(stats))
        return 0
    options = json_option("--target-options", args.target_options)
    source = os.path.abspath(local_path(args.source)) if is_local(args.source) else args.source
    revision = tools.revision_of({k: getattr(args, k, None) for k in tools.REVISION_OPTIONS},
                                 getattr(args, "options", []))
    if command == "inspect":
        from refmount.targets.rules import TargetRules, load_rules

        rules = TargetRules.from_json(load_rules(args.targets, "--targets")) if args.targets else None
        info = tools.inspect(source, options, rules, format=args.format, revision=revision)
        print(json.dumps(info, indent=2) if args.json else tools.format_inspect(info))
        return 0
    if args.output == "-":
        n = tools.expand(source, sys.stdout, options, format=args.format, revision=revision)
    else:
        with fsspec.open(args.output, "wt", compression="infer", encoding="utf-8") as out:
            n = tools.expand(source, out, options, format=args.format, revision=revision)
    print(f"refmount: wrote {n:,} keys", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None, credentials_warning: str | None = None) -> int:
    """The CLI. ``credentials_warning``: what ``cmdline.hide_credentials`` returned when the
    refmount command (``__main__.py``) called it first; called here otherwise."""
    if argv is None and credentials_warning is None:
        credentials_warning = hide_credentials()
    argv = sys.argv[1:] if argv is None else argv
    ignore_user_signals()
    try:
        if argv and argv[0] == "serve":
            return _run_serve(argv[1:])
        if argv and argv[0] == "verify":
            stderr_warnings()
            if credentials_warning:
                print(credentials_warning, file=sys.stderr)
            return _run_verify(argv[1:])
        if argv and argv[0] in SUBCOMMANDS:
            stderr_warnings()
            if credentials_warning:
                print(credentials_warning, file=sys.stderr)
            return _run_tool(argv[0], argv[1:])
        if argv and (hint := _mistyped_command(argv[0])):
            return fail(hint)
        args = _parser().parse_args(argv)
        return _run(args, credentials_warning)
    except (ReferenceSetError, ConfigError, RuntimeError) as e:
        return fail(str(e))
    except BrokenPipeError:
        return 1
    except KeyboardInterrupt:
        return fail("interrupted")
    except Exception as e:  # never a traceback for bad input: one line, non-zero exit
        log.debug("unexpected error", exc_info=True)
        return fail(f"unexpected {type(e).__name__}: {e}")


def _mistyped_command(word: str) -> str | None:
    """``refmount stat /mnt`` would mount a SOURCE named 'stat': a first word that is no
    file and no URL but close to a command is reported as a mistyped command."""
    if word.startswith("-") or "://" in word or "::" in word or os.path.lexists(word):
        return None
    hint = did_you_mean(word, SUBCOMMANDS)
    return f"unknown command {word!r}{hint}" if hint else None


def _run(args: argparse.Namespace, credentials_warning: str | None = None) -> int:
    try:
        cfg = config_from_args(args)
    except ConfigError as e:
        return fail(str(e))
    # Until the daemon takes over, warnings (e.g. skipped keys) go to stderr.
    stderr_warnings()

    def checks() -> None:
        if cfg.recover:
            recover_stale_mount(cfg.mountpoint)
        check_mountpoint(cfg.mountpoint, cfg.nonempty)
        hand_over_pins(cfg)  # parsed once, its table handed to what serves
        if cfg.disk_cache:
            check_cache_dir(cfg.cache_dir)  # before anything is written there

    if cfg.foreground:
        def ready() -> None:
            if credentials_warning:
                print(credentials_warning, file=sys.stderr, flush=True)

        daemon_module = "refmount.fuse.daemon"
        return serve_in_foreground(cfg, checks, daemon_module, lambda daemon, index_file, log_target: (
            daemon.serve(cfg, index_file, on_ready=ready, log_target=log_target)))
    code = serve_detached(cfg, checks, lambda: DaemonLauncher(
        cfg.mountpoint, preload=not getattr(cfg, "catalog", False)))
    if code == 0 and credentials_warning:
        print(credentials_warning, file=sys.stderr)
    return code
