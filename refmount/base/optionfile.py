"""Files named by an option's ``@FILE`` value (storage options, target rules, pins, tokens),
read within a bound: one ``ConfigError`` line when a file cannot be read, is larger than its
option allows (``/dev/zero`` included) or is not UTF-8 text. Never echoes the content: it may
hold credentials."""

from __future__ import annotations

from refmount.base.errors import ConfigError

MAX_OPTION_FILE = 1 << 20  # a JSON option (remote_options=@FILE, ...) read at start


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 and n % (1 << 20) == 0 else f"{n:,} bytes"


def read_option_bytes(path: str, name: str, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``; ConfigError naming the option ``name`` otherwise."""
    try:
        with open(path, "rb") as f:
            data = f.read(limit + 1)
    except OSError as e:
        raise ConfigError(f"{name}: cannot read {path}: {e.strerror or e}") from None
    if len(data) > limit:
        raise ConfigError(f"{name}: {path} is larger than {_size(limit)}")
    return data


def read_option_text(path: str, name: str, limit: int = MAX_OPTION_FILE) -> str:
    """``read_option_bytes`` as UTF-8 text."""
    try:
        return read_option_bytes(path, name, limit).decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{name}: {path} is not UTF-8 text") from None
