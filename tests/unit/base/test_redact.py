"""redact_url on HTTP credentials in text, and the log formatter's known secrets."""

from __future__ import annotations

import logging

import pytest

from refmount.base.redact import RedactingFormatter, redact_url

S = "Zx9SENTINELq"


@pytest.mark.parametrize("text, shown", [
    (f"Authorization: Bearer {S}", "Authorization: ***"),
    (f"b'authorization: token {S}\\x01'", "b'authorization: ***'"),  # to the quote
    (f"Proxy-Authorization=Basic {S}", "Proxy-Authorization=***"),
    (f"got Bearer {S}.a-b/c= back", "got Bearer *** back"),
    (f"GET /x?h=Bearer%20{S} HTTP/9.9", "GET /x?h=Bearer%20*** HTTP/9.9"),
    (f"token {S}", "token ***"),
    ("a bearer token is required", "a bearer token is required"),  # prose stays readable
    ("the token expired", "the token expired"),
])
def test_http_credentials_in_text(text: str, shown: str) -> None:
    assert redact_url(text) == shown


def test_known_secrets_are_redacted_wherever_they_appear() -> None:
    formatter = RedactingFormatter("%(message)s")
    formatter.known = (S,)
    record = logging.LogRecord("aiohttp.server", logging.ERROR, __file__, 1,
                               "Error handling request: %r", (f"GET /{S}x HTTP/9.9".encode(),), None)
    assert S not in formatter.format(record) and "GET /***x HTTP/9.9" in formatter.format(record)
