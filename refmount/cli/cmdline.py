"""Keeping credentials off the command line, which every user of the machine can read
(``ps auxww``, ``/proc/PID/cmdline``).

refmount's own processes never carry configuration in argv: the daemon and the indexer read it
on stdin, and ``refmount --env MOUNTPOINT`` (what ``refmount@.service`` runs) takes SOURCE and
the mount options from the environment (``REFMOUNT_SOURCE``, ``REFMOUNT_OPTIONS``), which only
the process's own user and root can read. What a user still types on a command line — a
password in SOURCE's URL, a signed URL, inline ``remote_options``/``target_options``/``targets`` JSON —
is masked in this process's argument memory as early as the CLI starts (:func:`hide_credentials`),
with one warning once the mount answers: until the mask, for the first tenth of a second or
so, it was visible.

The argument memory is rewritten in place through ``/proc/self/mem`` (its address from
``/proc/self/stat``), argument by argument, so the masked command line keeps its arguments
(``pgrep -f MOUNTPOINT`` still finds the mount). Linux only, like FUSE; where it cannot be done
the warning says so.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, MutableMapping

from refmount.base.redact import redact_url
from refmount.config import split_options

ENV_SOURCE = "REFMOUNT_SOURCE"
ENV_OPTIONS = "REFMOUNT_OPTIONS"
# "@FILE" is a name, not a secret; ``targets`` rules hold storage options.
INLINE_JSON_OPTIONS = ("remote_options", "target_options", "targets")
MASK = "***"
WARNING = ("refmount: WARNING: credentials on the command line ({what}) were visible to every "
           "user of this machine (ps, /proc) until refmount {how}; put them in a file only you "
           "can read (remote_options=@FILE, target_options=@FILE, targets=@FILE) or pass SOURCE and options "
           "in the environment (refmount --env MOUNTPOINT, $REFMOUNT_SOURCE, $REFMOUNT_OPTIONS)")


def _split(arg: str) -> tuple[str, str]:
    """``-oGROUP`` -> ("-o", GROUP); anything else -> ("", arg)."""
    return ("-o", arg[2:]) if arg.startswith("-o") and len(arg) > 2 else ("", arg)


TOOL_OPTION = "--target-options"  # refmount expand/inspect: JSON or @FILE
TOOL_OPTIONS = (TOOL_OPTION, "--targets")  # refmount inspect --targets: rules, JSON or @FILE


def _tool_option(arg: str, previous: str) -> str | None:
    """The tool option whose value ``arg`` is or holds (None: none)."""
    for name in TOOL_OPTIONS:
        if previous == name or arg.startswith(name + "="):
            return name
    return None


def inline_json(arg: str, previous: str = "") -> list[str]:
    """The inline JSON values in ``arg``: of ``remote_options``/``target_options``/``targets``
    in a ``-o`` group, or the value of ``--target-options``/``--targets`` (``previous`` is
    the argument before)."""
    if (name := _tool_option(arg, previous)) is not None:
        value = arg.removeprefix(name + "=")
        return [] if value.startswith("@") else [value]
    body = _split(arg)[1]
    if not any(f"{name}=" in body for name in INLINE_JSON_OPTIONS):
        return []
    values = []
    for part in split_options(body):
        name, sep, value = part.partition("=")
        if sep and name.strip() in INLINE_JSON_OPTIONS and not value.startswith("@"):
            values.append(value)
    return values


def masked_argument(arg: str, previous: str = "") -> str:
    """``arg`` as it may be shown: inline JSON of ``remote_options``/``target_options`` (in a
    ``-o`` group, ``-oGROUP`` too) and of ``--target-options`` replaced by ``***``, and every
    URL password, credential-like query value or ``name=value`` pair redacted
    (``redact_url``)."""
    if inline_json(arg, previous) and (name := _tool_option(arg, previous)) is not None:
        return MASK if previous == name else f"{name}={MASK}"
    prefix, body = _split(arg)
    if inline_json(arg):
        parts = []
        for part in split_options(body):
            name, sep, value = part.partition("=")
            if sep and name.strip() in INLINE_JSON_OPTIONS and not value.startswith("@"):
                part = f"{name}={MASK}"
            parts.append(part)
        body = ",".join(parts)
    return prefix + redact_url(body)


def masked_arguments(args: list[str]) -> list[str]:
    return [masked_argument(a, p) for p, a in zip(["", *args[:-1]], args, strict=True)]


def _may_hold_credentials(value: str) -> bool:
    """Inline JSON with a string value anywhere (or not JSON at all): ``{"anon": true}`` holds
    none, nor do target rules without string options."""
    try:
        stack = [json.loads(value)]
    except ValueError:
        return True
    if isinstance(stack[0], list) and all(isinstance(r, dict) for r in stack[0]):
        # targets rules: prefixes and rewrites are places (their passwords are found as in
        # any URL), options and credential commands may be secrets.
        stack = [r.get(k) for r in stack[0] for k in ("options", "credentials") if k in r]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())  # names are not secrets, values may be
        elif isinstance(item, list):
            stack.extend(item)
    return False


def secrets_in(args: list[str]) -> list[str]:
    """The kinds of credential ``args`` may hold, for the warning (empty: none)."""
    what = []
    for previous, arg in zip(["", *args[:-1]], args, strict=True):
        if any(_may_hold_credentials(v) for v in inline_json(arg, previous)):
            what.append("inline remote_options/target_options JSON")
        if redact_url(arg) != arg:
            what.append("a password, token or signature")
    return list(dict.fromkeys(what))


def _arg_area() -> tuple[int, int]:
    """Start and end address of this process's argument strings (/proc/self/stat fields 48
    and 49, Linux 3.5+)."""
    with open("/proc/self/stat", "rb") as f:
        fields = f.read().rsplit(b")", 1)[1].split()
    return int(fields[48 - 3]), int(fields[49 - 3])


def rewrite_cmdline(args: list[bytes]) -> bool:
    """Make /proc/self/cmdline read ``args``: written over the original argument strings,
    NUL-separated, the rest of that memory zeroed. Each argument must be no longer than the
    one it replaces (so the whole fits). False where the memory cannot be written."""
    try:
        start, end = _arg_area()
        new = b"\0".join(args) + b"\0"
        if not start or len(new) > end - start:
            return False
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(new.ljust(end - start, b"\0"))
        return True
    except (OSError, ValueError, IndexError):
        return False


def hide_credentials() -> str | None:
    """Mask the credentials of this process's command line (see the module's docstring).
    Returns the warning to show (None: there were none), which the CLI prints once the mount
    answers — a refusal stays one line. Call it first thing in the CLI."""
    try:
        with open("/proc/self/cmdline", "rb") as f:
            raw = f.read()
    except OSError:
        return None
    original = [os.fsdecode(a) for a in raw.split(b"\0")]
    if original and original[-1] == "":
        original.pop()
    shown = masked_arguments(original)
    if shown == original:
        return None
    # Each argument cut to the length of the one it replaces (a prefix of masked text holds
    # no secret), so that the whole fits in the original memory.
    done = rewrite_cmdline([os.fsencode(s)[: len(os.fsencode(a))]
                            for s, a in zip(shown, original, strict=True)])
    what = secrets_in(original)
    if not what:
        return None
    how = "hid them" if done else "exited (they could not be hidden)"
    return WARNING.format(what=", ".join(what), how=how)


def take_configuration(environ: MutableMapping[str, str]) -> tuple[str | None, list[str]]:
    """SOURCE and the ``-o`` options from the environment (``refmount --env``), removed from
    it so that the processes this one starts do not inherit them (they get the configuration
    on stdin)."""
    source = environ.pop(ENV_SOURCE, None) or None
    options = split_options(environ.pop(ENV_OPTIONS, ""))
    return source, options


def configuration_environment(source: str, options: list[str],
                              base: Mapping[str, str] | None = None) -> dict[str, str]:
    """An environment that hands SOURCE and ``options`` to ``refmount --env``."""
    env = dict(os.environ if base is None else base)
    env[ENV_SOURCE] = source
    env[ENV_OPTIONS] = ",".join(options)
    return env
