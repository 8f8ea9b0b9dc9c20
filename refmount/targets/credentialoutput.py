"""What a credential process prints, read: its JSON output (refmount's format or AWS's
``credential_process``) parsed into a ``Credential`` (storage options and expiry), and storage
options merged (``targets/credentials.py`` runs the process and refreshes the credential).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

EXPIRY_SKEW = 30.0  # a credential is not used in the last tenth of its lifetime, at most this
MIN_INTERVAL = 1.0  # the background refresh runs the command at most once a second

_REFMOUNT_FIELDS = {"options", "expiry"}
_AWS_FIELDS = {"Version", "AccessKeyId", "SecretAccessKey", "SessionToken", "Expiration"}


@dataclass(frozen=True)
class Credential:
    """Storage options and when they stop being valid (seconds since the epoch; None:
    never). ``issued`` is when refmount received them."""

    options: Mapping[str, Any]
    expiry: float | None
    issued: float

    def __repr__(self) -> str:  # the options never reach a log through a repr
        return f"Credential(expiry={self.expiry!r}, issued={self.issued!r}, options=***)"

    @property
    def usable_until(self) -> float | None:
        """When it stops being used: shortly before its expiry (a tenth of its lifetime, at
        most ``EXPIRY_SKEW`` s), so that no request leaves with a credential about to expire
        (a server's clock, a request queued behind others)."""
        if self.expiry is None:
            return None
        return self.expiry - min(EXPIRY_SKEW, max(self.expiry - self.issued, 0.0) / 10)

    def refresh_at(self, margin: float) -> float | None:
        """When to fetch the next one: ``margin`` before the expiry, but no earlier than
        three quarters of the way through its lifetime (and before it stops being used)."""
        if self.expiry is None:
            return None
        lifetime = max(self.expiry - self.issued, 0.0)
        until = self.usable_until
        assert until is not None
        # Never sooner than MIN_INTERVAL after the last: a command printing credentials that
        # live a moment does not make a busy loop.
        return max(min(self.expiry - min(margin, lifetime / 4), until),
                   self.issued + MIN_INTERVAL)

    def valid(self, now: float) -> bool:
        until = self.usable_until
        return until is None or now < until


def parse_expiry(value: Any) -> float | None:
    """An expiry as seconds since the epoch: ISO 8601 text (UTC if it names no zone), a
    number of seconds since the epoch, or None. ValueError naming the problem (the value is
    not repeated: it is part of the output, which is never shown)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("the expiry is true or false, not a time")
    if isinstance(value, int | float):
        if not math.isfinite(value) or value <= 0:
            raise ValueError("the expiry is not a positive number of seconds since the epoch")
        return float(value)
    if isinstance(value, str):
        try:
            when = datetime.fromisoformat(value.strip())
        except ValueError:
            raise ValueError("the expiry is not an ISO 8601 time") from None
        if when.tzinfo is None:
            when = when.replace(tzinfo=UTC)
        return when.timestamp()
    raise ValueError(f"the expiry is a JSON {type(value).__name__}, not a time or a number")


def parse_output(data: bytes, *, now: float) -> Credential:
    """The credential a process printed (see the module's docstring). ValueError naming what
    is wrong, never quoting the output."""
    try:
        doc = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ValueError("its output is not UTF-8 text") from None
    except json.JSONDecodeError as e:
        raise ValueError(f"its output is not JSON (line {e.lineno}, column {e.colno})") from None
    if not isinstance(doc, dict):
        raise ValueError("its output is not a JSON object")
    if "Version" in doc:
        unknown = sorted(set(doc) - _AWS_FIELDS)
        if doc["Version"] != 1:
            raise ValueError("its output has \"Version\" other than 1 (AWS credential_process "
                             "format Version 1 is understood)")
        options: dict[str, Any] = {}
        for field, option in (("AccessKeyId", "key"), ("SecretAccessKey", "secret"),
                              ("SessionToken", "token")):
            value = doc.get(field)
            if value is None and field == "SessionToken":
                continue
            if not isinstance(value, str) or not value:
                raise ValueError(f"its output has no \"{field}\" string (AWS credential_process "
                                 "format)")
            options[option] = value
        expiry = parse_expiry(doc.get("Expiration"))
    elif "options" in doc:
        unknown = sorted(set(doc) - _REFMOUNT_FIELDS)
        options = doc["options"]
        if not isinstance(options, dict):
            raise ValueError("its \"options\" is not a JSON object of storage options")
        expiry = parse_expiry(doc.get("expiry"))
    else:
        raise ValueError("its output has neither \"options\" (refmount's format) nor "
                         "\"Version\" (AWS credential_process format)")
    if unknown:
        raise ValueError(f"its output has unknown fields: {', '.join(map(repr, unknown))[:200]}")
    if expiry is not None and expiry <= now:
        ago = now - expiry
        raise ValueError(f"the credential it printed expired {ago:.0f} s ago "
                         f"({utc(expiry)}): is the clock right?")
    return Credential(options, expiry, now)


def utc(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def merge_options(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` on top; a value that is an object in both (``headers``,
    ``client_kwargs``) is merged the same way, so a credential's ``Authorization`` header
    keeps the rule's other headers."""
    out = dict(base)
    for name, value in extra.items():
        if isinstance(value, Mapping) and isinstance(out.get(name), Mapping):
            out[name] = merge_options(out[name], value)
        else:
            out[name] = value
    return out
