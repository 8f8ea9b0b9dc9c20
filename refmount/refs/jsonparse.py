"""What the JSON readers (Version 0 in jsonrefs.py, Version 1 in v1.py) share: the ``Opener``
they read SOURCE's text through, and a parser's error as one line (``json_error``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import IO

from refmount.refs.model import ReferenceSetError

Opener = Callable[[], IO[bytes]]


class IntegerOverflow(ReferenceSetError):
    """yajl (the C parser) stops at integers beyond 64 bits; such files are valid JSON and
    are read again with ijson's pure-Python parser."""


class MalformedJSON(ReferenceSetError):
    """The text is not JSON (as yajl reads it)."""


def json_error(name: str, err: Exception) -> ReferenceSetError:
    # yajl's message is "parse error: <what>" + the text around the error + a "^" marker
    # on further lines: keep the first line and quote the context, on one line.
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if any("integer overflow" in ln for ln in lines):
        return IntegerOverflow(f"{name}: integer beyond 64 bits")
    msg = lines[0] if lines else type(err).__name__
    context = [ln for ln in lines[1:] if "(right here)" not in ln]
    if context:
        msg += f" near {context[0][:60]!r}"
    if len(msg) > 160:
        msg = msg[:157] + "..."
    return MalformedJSON(f"{name}: malformed JSON: {msg}")
