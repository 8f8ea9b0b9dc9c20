"""How an option's text becomes its value: the kinds of values (flag, text, size, seconds, JSON,
directories, …), each parsing its text with a one-line error that names the option, and the
small parsers they share (``split_options``, ``parse_size``, ``split_listen``)."""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from refmount.base.errors import ConfigError
from refmount.base.optionfile import read_option_text

DECODE_MAX_CHUNK_BYTES = 256 * 2**20  # max_chunk_bytes: the largest chunk -o decode decodes
MAX_RULES_FILE = 1 << 20  # bytes of a targets=@FILE read at start


def default_cache_dir() -> str:
    if os.geteuid() == 0:
        return "/var/cache/refmount"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "refmount")


def split_options(text: str) -> list[str]:
    """Split ``-o a,b=c,d={"x":1,"y":2}`` on commas outside JSON brackets and quotes."""
    parts: list[str] = []
    depth = 0
    quote: str | None = None
    cur: list[str] = []
    escaped = False
    for ch in text:
        if quote:
            cur.append(ch)
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = None
            continue
        if ch in "\"'" and depth:
            quote = ch
        elif ch in "{[":
            depth += 1
        elif ch in "}]":
            depth -= 1
        elif ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
            continue
        cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts if p.strip()]


def parse_size(text: str, name: str = "") -> int:
    """'512M', '10G', '4096', '1.5GiB' -> bytes (``name``: the option, for errors)."""
    what = f"{name}: " if name else ""
    t = text.strip().upper().removesuffix("IB").removesuffix("B")
    mult = 1
    for suffix, m in (("K", 2**10), ("M", 2**20), ("G", 2**30), ("T", 2**40)):
        if t.endswith(suffix):
            t, mult = t[:-1], m
            break
    try:
        value = float(t)
    except ValueError:
        raise ConfigError(f"{what}not a size: {text!r} (use e.g. 4096, 64M, 10G)") from None
    if not math.isfinite(value):
        raise ConfigError(f"{what}not a size: {text!r} (use e.g. 4096, 64M, 10G)")
    if value < 0:
        raise ConfigError(f"{what}size must not be negative: {text!r}")
    return int(value * mult)


def json_option(name: str, value: str) -> dict[str, Any]:
    if value.startswith("@"):
        value = read_option_text(value[1:], name)
    try:
        obj = json.loads(value)
    except json.JSONDecodeError as e:
        # The value may hold credentials: never echo it.
        raise ConfigError(f"{name} is not valid JSON ({e.msg} at char {e.pos})") from None
    if not isinstance(obj, dict):
        raise ConfigError(f"{name} must be a JSON object")
    return obj



def format_size(n: int) -> str:
    """Bytes as the largest unit that divides them exactly: 4194304 -> '4M'."""
    for suffix, m in (("T", 2**40), ("G", 2**30), ("M", 2**20), ("K", 2**10)):
        if n and n % m == 0:
            return f"{n // m}{suffix}"
    return str(n)


# --- kinds of values ---------------------------------------------------------------------------
# A kind turns the text after ``name=`` into the field's value (raising ConfigError with a
# message that names the option and the problem) and shows a default the way it is written.


@dataclass(frozen=True)
class Flag:
    """An option without a value: writing it sets the field to ``sets``."""

    sets: Any = True
    metavar: str = ""
    pytype: str = "bool"

    def parse(self, name: str, text: str) -> Any:
        return self.sets

    def show(self, value: Any) -> str:
        return "off"


@dataclass(frozen=True)
class Text:
    """A string; empty means None (the default's meaning) unless ``required``."""

    metavar: str = "NAME"
    pytype: str = "str | None"
    required: bool = False

    def parse(self, name: str, text: str) -> str | None:
        if self.required and not text:
            raise ConfigError(f"{name} needs a {self.metavar.lower()}, got nothing")
        return text or None

    def show(self, value: Any) -> str:
        return "none" if value is None else str(value)


@dataclass(frozen=True)
class Choice:
    choices: tuple[str, ...]
    pytype: str = "str"

    @property
    def metavar(self) -> str:
        return "|".join(self.choices)

    def parse(self, name: str, text: str) -> str:
        if text.lower() not in self.choices:
            raise ConfigError(f"{name} must be {', '.join(self.choices[:-1])} or "
                              f"{self.choices[-1]}, got {text!r}")
        return text.lower()

    def show(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class Json:
    """A JSON object, inline or ``@FILE``; never echoed in errors (it may hold credentials)."""

    metavar: str = "JSON|@FILE"
    pytype: str = "dict[str, Any]"

    def parse(self, name: str, text: str) -> dict[str, Any]:
        return json_option(name, text)

    def show(self, value: Any) -> str:
        return json.dumps(value)


@dataclass(frozen=True)
class Rules:
    """Target rules: JSON, inline or ``@FILE`` (read now, at most ``MAX_RULES_FILE`` bytes).
    What the rules mean is the targets layer's to check (``targets.check_rules``, called by the
    command before anything starts). Never echoed: rule options may hold credentials."""

    metavar: str = "JSON|@FILE"
    pytype: str = "list[dict[str, Any]]"

    def parse(self, name: str, text: str) -> Any:
        if text.startswith("@"):
            text = read_option_text(text[1:], name, MAX_RULES_FILE)
        try:
            return json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"{name} is not valid JSON ({e.msg} at char {e.pos})") from None
        except RecursionError:
            raise ConfigError(f"{name}: JSON nested too deeply") from None

    def show(self, value: Any) -> str:
        return f"{len(value)} rule{'' if len(value) == 1 else 's'}" if value else "none"


@dataclass(frozen=True)
class Int:
    lo: int
    hi: int = 2**31 - 1
    base: int = 10
    metavar: str = "N"
    pytype: str = "int"

    def parse(self, name: str, text: str) -> int:
        try:
            v = int(text, self.base)
        except ValueError:
            what = "an octal number" if self.base == 8 else "an integer"
            raise ConfigError(f"{name} must be {what}, got {text!r}") from None
        if not self.lo <= v <= self.hi:
            raise ConfigError(f"{name} must be from {self.show(self.lo)} to {self.show(self.hi)}, "
                              f"got {text!r}")
        return v

    def show(self, value: Any) -> str:
        return f"{value:03o}" if self.base == 8 else str(value)


@dataclass(frozen=True)
class Size:
    """Bytes with an optional K/M/G/T suffix (powers of 1024); ``off`` gives ``off_value``."""

    lo: int = 0
    off_value: int | None = None
    metavar: str = "SIZE"
    pytype: str = "int"

    def parse(self, name: str, text: str) -> int:
        if self.off_value is not None and text.strip().lower() in ("off", str(self.off_value)):
            return self.off_value
        v = parse_size(text, name)
        if v < self.lo:
            raise ConfigError(f"{name} must be at least {format_size(self.lo)}, got {text!r}")
        return v

    def show(self, value: Any) -> str:
        return "off" if value == self.off_value else format_size(value)


@dataclass(frozen=True)
class Seconds:
    metavar: str = "SEC"
    pytype: str = "float"
    zero: bool = False  # 0 is allowed (it means off)

    def parse(self, name: str, text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise ConfigError(f"{name} must be a number of seconds, got {text!r}") from None
        if not math.isfinite(v):  # trio's deadlines and the kernel's timeouts take finite numbers
            raise ConfigError(f"{name} must be a finite number of seconds, got {text!r}")
        if v < 0 or (v == 0 and not self.zero):
            raise ConfigError(f"{name} must be {'0 or more' if self.zero else 'positive'}, "
                              f"got {text!r}")
        return v

    def show(self, value: Any) -> str:
        return f"{value:g}"


@dataclass(frozen=True)
class Directory:
    """A path, made absolute against the directory refmount was started in (the daemon
    changes to / before it uses it)."""

    metavar: str = "DIR"
    pytype: str = "str"

    def parse(self, name: str, text: str) -> str:
        if not text:
            raise ConfigError(f"{name} needs a path, got nothing")
        return os.path.abspath(text)

    def show(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class LogTarget:
    metavar: str = "stderr|syslog|FILE"
    pytype: str = "str | None"

    def parse(self, name: str, text: str) -> str:
        if not text:
            raise ConfigError(f"{name} must be stderr, syslog or a file path, got nothing")
        return text if text in ("stderr", "syslog") else os.path.abspath(text)

    def show(self, value: Any) -> str:
        return str(value)


@dataclass(frozen=True)
class Directories:
    metavar: str = "DIR[:DIR...]"
    pytype: str = "list[str] | None"

    def parse(self, name: str, text: str) -> list[str]:
        roots = [r for r in text.split(":") if r]
        if not all(os.path.isabs(r) for r in roots):
            raise ConfigError(f"{name} takes absolute directories separated by ':', got {text!r}")
        return [os.path.realpath(r) for r in roots]

    def show(self, value: Any) -> str:
        return ":".join(value)


@dataclass(frozen=True)
class Listen:
    """``HOST:PORT`` (``[V6]:PORT`` for IPv6); port 0 lets the system choose. With
    ``port_alone``, a ``PORT`` alone is that port on the loopback address."""

    metavar: str = "HOST:PORT"
    pytype: str = "str"
    port_alone: bool = False

    def parse(self, name: str, text: str) -> str:
        if self.port_alone and text.isdigit():
            text = "127.0.0.1:" + text
        split_listen(text, name)
        return text

    def show(self, value: Any) -> str:
        return str(value)


def split_listen(text: str, name: str = "listen") -> tuple[str, int]:
    """``HOST:PORT`` -> (host, port); ConfigError naming the problem."""
    host, sep, port = text.rpartition(":")
    host = host.removeprefix("[").removesuffix("]")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{name} must be HOST:PORT (e.g. 127.0.0.1:8080), got {text!r}")
    return host, int(port)


@dataclass(frozen=True)
class Cors:
    """``*`` or origins (``scheme://host[:port]``) separated by ``|``; what they mean is the HTTP
    front end's to check (``cors.cors_problem``, called by the command before it serves)."""

    metavar: str = "ORIGIN[|ORIGIN...]|*"
    pytype: str = "str | None"

    def parse(self, name: str, text: str) -> str:
        return text

    def show(self, value: Any) -> str:
        return "none" if value is None else str(value)


@dataclass(frozen=True)
class TokenFile:
    """``@FILE``: a file holding a secret. The path is kept, never the secret (the
    configuration is logged); the serving process reads it (``read_token``)."""

    metavar: str = "@FILE"
    pytype: str = "str | None"

    def parse(self, name: str, text: str) -> str:
        if not text.startswith("@") or len(text) < 2:
            raise ConfigError(f"{name} takes @FILE, a file holding the token (never the token "
                              "itself: it would show in ps and logs)")
        path = os.path.abspath(text[1:])
        read_token(path, name)
        return path

    def show(self, value: Any) -> str:
        return "none" if value is None else f"@{value}"


def read_token(path: str, name: str = "auth_token") -> str:
    """The token in ``path`` (surrounding white space stripped); ConfigError if unusable."""
    token = read_option_text(path, name, limit=8192).strip()
    if not token or len(token) > 4096 or any(c.isspace() or not c.isprintable() for c in token):
        raise ConfigError(f"{name}: {path} must hold one token of 1 to 4096 printable "
                          "characters without spaces")
    return token


Kind = (Flag | Text | Choice | Json | Rules | Int | Size | Seconds | Directory | LogTarget | Directories
        | Listen | Cors | TokenFile)


@dataclass(frozen=True)
class Option:
    """One ``-o`` option. ``default`` is the MountConfig field's default (a callable is called
    for each new config); ``shown_default`` documents it when the value alone says little."""

    name: str
    kind: Kind
    default: Any
    help: str
    field: str = ""  # the MountConfig attribute, when it is not ``name``
    shown_default: str = ""
    implies: tuple[tuple[str, Any], ...] = ()  # other fields this option also sets

    @property
    def attr(self) -> str:
        return self.field or self.name

    @property
    def spec(self) -> str:
        """How it is written: ``name`` or ``name=METAVAR``."""
        return f"{self.name}={self.kind.metavar}" if self.kind.metavar else self.name

    def shown(self) -> str:
        if self.shown_default:
            return self.shown_default
        return self.kind.show(self.default() if callable(self.default) else self.default)
