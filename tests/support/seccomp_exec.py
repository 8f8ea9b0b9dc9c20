"""Run a command under a seccomp filter, as systemd's SystemCallFilter= does: only the system
calls named in a file (one per line) are allowed; any other kills the process (stricter than
the unit's SystemCallErrorNumber=EPERM, so that no call outside the filter goes unnoticed).

Run with the system's Python (Debian's python3-seccomp):
    /usr/bin/python3 seccomp_exec.py ALLOWED_FILE COMMAND [ARG...]
"""

import contextlib
import os
import sys

import seccomp


def main(argv: list[str]) -> int:
    with open(argv[1]) as names:
        allowed = names.read().split()
    f = seccomp.SyscallFilter(seccomp.KILL_PROCESS)
    for name in allowed:
        with contextlib.suppress(RuntimeError, ValueError, OSError):  # not of this architecture
            f.add_rule(seccomp.ALLOW, name)
    f.load()
    os.execv(argv[2], argv[2:])
    return 127


if __name__ == "__main__":
    sys.exit(main(sys.argv))
