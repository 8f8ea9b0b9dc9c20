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
  strings, JSON) have their value replaced too.

Over-redacting is preferred to leaking: a name that merely contains ``key`` or ``auth`` is
redacted as well.
"""

from __future__ import annotations

import logging
import re

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


def redact_url(url: str) -> str:
    """Drop user information, credential-like and signature query values, and credential-like
    ``name=value`` pairs from a URL or any text quoting URLs, before it is shown."""
    text = _USERINFO.sub("***@", url)
    text = _SECRET_QUERY.sub(r"\1***", text)
    return _SECRET_PAIR.sub(_pair_redacted, text)


def _pair_redacted(m: re.Match[str]) -> str:
    """A quoted value stays quoted, so that redacted JSON is still JSON."""
    quote = m[2][0] if m[2][0] in "\"'" else ""
    return f"{m[1]}{quote}***{quote}"


class RedactingFormatter(logging.Formatter):
    """Every log line passes through ``redact_url``: messages quote SOURCE, target URLs and
    backend exceptions, any of which may carry user:password@ or signed-URL tokens."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_url(super().format(record))
