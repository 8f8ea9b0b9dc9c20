"""Keeping credentials out of logs, xattrs and messages.

``redact_url`` works on any text (a URL, a log line quoting several, an exception message):

* user information: everything between ``scheme://`` and the *last* ``@`` before the path
  (a password may itself contain ``@`` or ``:``) becomes ``***``;
* query (and fragment-style ``;``) parameters whose name looks like a credential or a
  signature — ``password``, ``passwd``, ``pwd``, ``secret``, ``token``, ``auth``…, ``key``,
  ``apikey``, ``api_key``, ``access_key``, ``sig``, ``signature``, ``credential``,
  ``session``, ``X-Amz-*``, ``X-Goog-*``, ``X-Ms-*``, and Azure SAS fields (``se``, ``sp``,
  ``sv``, ``sr``, ``st``, ``spr``, ``srt``, ``ss``, ``sk*``) — have their whole value
  replaced, up to the next ``&``, ``#`` or white space (values may hold ``:``, ``/``, ``=``);
* ``name=value`` and ``"name": "value"`` pairs outside URLs with such a name (option
  strings, JSON) have their value replaced too;
* HTTP credentials in text (a credential command's stderr, an HTTP library's message quoting
  a request): an ``Authorization:`` header's whole value, the credential after ``Bearer`` or
  ``Basic`` (6 characters or more), and after ``token`` one of 8 characters or more.

Over-redacting is preferred to leaking: a name that merely contains ``key`` or ``auth`` is
redacted as well.
"""

from __future__ import annotations

import logging
import re
import urllib.parse
from typing import Any

# scheme://user:pass@host — up to the last "@" before the path, a space or the end.
_USERINFO = re.compile(r"(?<=://)[^/\s]*@")
_SECRET_NAME = (
    r"[\w.-]*(?:pass|pwd|secret|token|auth|key|sig|credential|session|cookie|bearer)[\w.-]*"
    r"|x-(?:amz|goog|ms)-[\w.-]*|se|sp|sv|sr|st|spr|srt|ss|sk[\w-]*|code"
)
# In a query: ?name=value / &name=value / ;name=value, the value up to &, # or space.
_SECRET_QUERY = re.compile(rf"(?i)([?&;](?:{_SECRET_NAME})=)[^&#\s]*")
# Outside URLs: name=value (options), "name": "value" / 'name': 'value' (JSON, reprs).
_PAIR_NAME = r"[\w.-]*(?:password|passwd|secret|token|apikey|api_key|access_key|signature|credential)[\w.-]*"
_SECRET_PAIR = re.compile(
    rf"""(?i)((?<![\w?&;.-]){_PAIR_NAME}\s*=\s*|["']{_PAIR_NAME}["']\s*:\s*)"""
    r"""("[^"]*"|'[^']*'|[^\s,;&}\]]+)"""
)


# HTTP credentials in text: an Authorization header's whole value; a Bearer or Basic
# credential of 6 characters or more anywhere ("Bearer abc123"); after "token", one of 8 or
# more (GitHub's "token ghp_..."). Prose stays readable: "a bearer token", "token expired".
_AUTH_HEADER = re.compile(r"(?i)(\b(?:proxy-)?authorization\s*[:=]\s*)[^\r\n'\"]+")
_SCHEME_CREDENTIAL = re.compile(
    r"(?i)(\b(?:bearer|basic)(?:\s+|%20|\+))[\w.~+/=%-]{6,}|(\btoken(?:\s+|%20|\+))[\w.~+/=%-]{8,}")


def redact_url(url: str) -> str:
    """Drop user information, credential-like and signature query values, credential-like
    ``name=value`` pairs, Authorization header values and Bearer/Basic/token credentials from
    a URL or any text quoting URLs or HTTP headers, before it is shown."""
    text = _USERINFO.sub("***@", url)
    text = _SECRET_QUERY.sub(r"\1***", text)
    text = _AUTH_HEADER.sub(r"\1***", text)
    text = _SCHEME_CREDENTIAL.sub(lambda m: (m[1] or m[2]) + "***", text)
    return _SECRET_PAIR.sub(_pair_redacted, text)


def _pair_redacted(m: re.Match[str]) -> str:
    """A quoted value stays quoted, so that redacted JSON is still JSON."""
    quote = m[2][0] if m[2][0] in "\"'" else ""
    return f"{m[1]}{quote}***{quote}"


class RedactingFormatter(logging.Formatter):
    """Every log line passes through ``redact_url``: messages quote SOURCE, target URLs and
    backend exceptions, any of which may carry user:password@ or signed-URL tokens. Secrets
    the process knows (``known``: the HTTP server's own bearer token, which a malformed
    request quoted by aiohttp may carry in any place) become ``***`` wherever they appear."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.known: tuple[str, ...] = ()

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        for secret in self.known:
            text = text.replace(secret, "***")
        return redact_url(text)


def redact_in_logs(secret: str) -> None:
    """From now on, ``secret`` (and its percent-encoded form) is ``***`` in every line the
    root logger's redacting handlers write."""
    forms = tuple(f for f in {secret, urllib.parse.quote(secret, safe="")} if f)
    for handler in logging.getLogger().handlers:
        if isinstance(handler.formatter, RedactingFormatter):
            handler.formatter.known = tuple(dict.fromkeys((*handler.formatter.known, *forms)))
