"""Keeping credentials out of logs, xattrs and messages."""

from __future__ import annotations

import logging
import re

_USERINFO = re.compile(r"(?<=://)[^/@\s]*@")
_SECRET_QUERY = re.compile(
    r"(?i)([?&](?:x-amz-[a-z-]*|sig|signature|token|access_token|key|api_key|"
    r"x-goog-[a-z-]*|se|sp|sv)=)[^&#\s:'\"]*"
)


def redact_url(url: str) -> str:
    """Drop user:password@ and signature/token query values from a URL before logging."""
    return _SECRET_QUERY.sub(r"\1***", _USERINFO.sub("***@", url))


class RedactingFormatter(logging.Formatter):
    """Every log line passes through ``redact_url``: messages quote SOURCE, target URLs and
    backend exceptions, any of which may carry user:password@ or signed-URL tokens."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_url(super().format(record))
