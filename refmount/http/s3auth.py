"""AWS Signature Version 4 of requests to the S3 dialect (``http/s3dialect.py``), checked against
one configured access-key pair.

Both forms are accepted: the ``Authorization: AWS4-HMAC-SHA256 Credential=..., SignedHeaders=...,
Signature=...`` header and the presigned URL (``X-Amz-Algorithm``, ``X-Amz-Credential``,
``X-Amz-Date``, ``X-Amz-Expires``, ``X-Amz-SignedHeaders``, ``X-Amz-Signature`` in the query).
The expected signature is computed by botocore's S3 signers (``S3SigV4Auth``,
``S3SigV4QueryAuth``) from the canonical request rebuilt from what came: the method, the path
(as sent, or re-encoded as SigV4 specifies: clients differ), the query decoded and re-encoded
(``X-Amz-Signature`` left out), the signed headers, and the payload hash the client declared
(``UNSIGNED-PAYLOAD`` for a presigned URL). Signatures are compared in constant time.

A request is refused (``Denied``, an S3 error code and a message; the secret never appears in
either) when its key is not the configured one, its signature differs, its time is more than
``max_skew`` seconds from the server's, or a presigned URL has expired (``X-Amz-Expires`` at
most 7 days, as S3 allows). An anonymous request is refused when a key pair is configured.
"""

from __future__ import annotations

import calendar
import hmac
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from urllib.parse import quote, unquote, unquote_to_bytes

from refmount.base.errors import MountError

__all__ = ["Denied", "SigV4Checker"]

_AUTH = re.compile(r"AWS4-HMAC-SHA256\s+(.*)", re.S)
_DATE = re.compile(r"\d{8}T\d{6}Z")
MAX_EXPIRES = 7 * 24 * 3600
MAX_SIGNED_HEADERS = 64


class Denied(Exception):
    """A request whose signature does not hold: a 403 with ``code``."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message


@dataclass(frozen=True)
class _Claim:
    access_key: str
    date: str  # YYYYMMDD of the scope
    region: str
    service: str
    signed_headers: list[str]
    signature: str
    timestamp: str  # X-Amz-Date


def _parse_time(stamp: str) -> float:
    return float(calendar.timegm(time.strptime(stamp, "%Y%m%dT%H%M%SZ")))


def _credential(value: str) -> tuple[str, str, str, str]:
    parts = value.split("/")
    if len(parts) != 5 or parts[4] != "aws4_request" or not re.fullmatch(r"\d{8}", parts[1]):
        raise Denied("AuthorizationHeaderMalformed", "the credential is not KEY/DATE/REGION/s3/aws4_request")
    return parts[0], parts[1], parts[2], parts[3]


class SigV4Checker:
    """Checks the requests of one access-key pair (the secret held here only)."""

    def __init__(self, access_key: str, secret_key: str, *, max_skew: float = 900.0) -> None:
        try:  # imported with a key pair only: an anonymous or plain server never loads botocore
            from botocore.credentials import Credentials
        except ImportError:
            raise MountError("s3_access_key needs botocore to check signatures: install "
                             "refmount with its s3 extra (pip install 'refmount[s3]')") from None
        self._credentials = Credentials(access_key, secret_key)
        self.access_key = access_key
        self.max_skew = max_skew

    def __repr__(self) -> str:  # never the secret
        return f"SigV4Checker(access_key={self.access_key!r})"

    def check(
        self,
        method: str,
        raw_path: str,
        query: list[tuple[str, str]],
        headers: dict[str, str],
        now: float | None = None,
    ) -> None:
        """Raise ``Denied`` unless the request is signed by the configured key.

        ``query`` is the raw query's pairs, still %-encoded; ``headers`` lower-case names."""
        now = time.time() if now is None else now
        names = {k for k, _ in query}
        authorization = headers.get("authorization")
        if authorization is not None:
            claim, payload = self._header_claim(authorization, headers), None
            at = self._request_time(claim, headers)
            if abs(now - at) > self.max_skew:
                raise Denied(
                    "RequestTimeTooSkewed",
                    "the difference between the request time and the server's time is too large",
                )
            pairs = query
        elif "X-Amz-Signature" in names or "X-Amz-Credential" in names:
            claim, expires = self._query_claim(query)
            at = _parse_time(claim.timestamp)
            if at - now > self.max_skew:
                raise Denied("AccessDenied", "the request is not valid yet (X-Amz-Date is in the future)")
            if now > at + expires:
                raise Denied("AccessDenied", "the request has expired")
            pairs = [(k, v) for k, v in query if k != "X-Amz-Signature"]
            payload = "UNSIGNED-PAYLOAD"
        else:
            raise Denied("AccessDenied", "anonymous access is not allowed: sign with the configured key")
        if not hmac.compare_digest(claim.access_key.encode(), self.access_key.encode()):
            raise Denied("InvalidAccessKeyId", "the access key id given is not known to this server")
        if claim.service != "s3":
            raise Denied("AuthorizationHeaderMalformed", "the credential's service must be s3")
        if claim.date != claim.timestamp[:8]:
            raise Denied("AuthorizationHeaderMalformed", "the credential's date is not the request's")
        signed = {}
        for name in claim.signed_headers:
            if name not in headers:
                raise Denied("AccessDenied", f"the signed header {name} is not in the request")
            signed[name] = headers[name]
        for path in self._paths(raw_path):
            expected = self._signature(method, path, pairs, signed, claim, payload)
            if hmac.compare_digest(expected.encode(), claim.signature.encode()):
                return
        raise Denied(
            "SignatureDoesNotMatch", "the request signature calculated does not match the signature given"
        )

    # ---- the two forms ------------------------------------------------------------------------
    @staticmethod
    def _header_claim(value: str, headers: dict[str, str]) -> _Claim:
        m = _AUTH.fullmatch(value.strip())
        if m is None:
            raise Denied("AccessDenied", "only AWS Signature Version 4 (AWS4-HMAC-SHA256) is accepted")
        fields: dict[str, str] = {}
        for part in m.group(1).split(","):
            k, _, v = part.strip().partition("=")
            fields[k] = v
        try:
            key, date, region, service = _credential(fields["Credential"])
            signed_headers = fields["SignedHeaders"].split(";")
            signature = fields["Signature"]
        except KeyError:
            raise Denied(
                "AuthorizationHeaderMalformed",
                "the Authorization header needs Credential, SignedHeaders and Signature",
            ) from None
        stamp = headers.get("x-amz-date", "")
        if not _DATE.fullmatch(stamp):
            stamp = _from_http_date(headers.get("date"))
        if len(signed_headers) > MAX_SIGNED_HEADERS:
            raise Denied("AuthorizationHeaderMalformed", "too many signed headers")
        return _Claim(key, date, region, service, signed_headers, signature, stamp)

    @staticmethod
    def _query_claim(query: list[tuple[str, str]]) -> tuple[_Claim, int]:
        q = {k: unquote(v) for k, v in query}
        if q.get("X-Amz-Algorithm") != "AWS4-HMAC-SHA256":
            raise Denied("AuthorizationQueryParametersError", "X-Amz-Algorithm must be AWS4-HMAC-SHA256")
        try:
            key, date, region, service = _credential(q["X-Amz-Credential"])
            stamp, signature = q["X-Amz-Date"], q["X-Amz-Signature"]
            signed_headers = q["X-Amz-SignedHeaders"].split(";")
            expires = int(q["X-Amz-Expires"])
        except (KeyError, ValueError):
            raise Denied(
                "AuthorizationQueryParametersError",
                "a presigned URL needs X-Amz-Credential, -Date, -Expires, -SignedHeaders and -Signature",
            ) from None
        if not _DATE.fullmatch(stamp) or not 0 < expires <= MAX_EXPIRES:
            raise Denied(
                "AuthorizationQueryParametersError",
                "X-Amz-Date must be YYYYMMDDTHHMMSSZ and X-Amz-Expires 1 to 604800 seconds",
            )
        if len(signed_headers) > MAX_SIGNED_HEADERS:
            raise Denied("AuthorizationQueryParametersError", "too many signed headers")
        return _Claim(key, date, region, service, signed_headers, signature, stamp), expires

    @staticmethod
    def _request_time(claim: _Claim, headers: dict[str, str]) -> float:
        if not claim.timestamp:
            raise Denied("AccessDenied", "a signed request needs X-Amz-Date (or Date)")
        return _parse_time(claim.timestamp)

    @staticmethod
    def _paths(raw_path: str) -> list[str]:
        """The canonical URI as sent, and as SigV4 specifies it (each byte but unreserved ones and
        ``/`` %-encoded once): clients encode ``!``, ``$``, ``*``... differently in the URL."""
        canonical = quote(unquote_to_bytes(raw_path), safe="/~")
        return [raw_path] if canonical == raw_path else [raw_path, canonical]

    def _signature(
        self,
        method: str,
        path: str,
        pairs: list[tuple[str, str]],
        signed: dict[str, str],
        claim: _Claim,
        payload: str | None,
    ) -> str:
        from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
        from botocore.awsrequest import AWSRequest

        signer_class = S3SigV4QueryAuth if payload == "UNSIGNED-PAYLOAD" else S3SigV4Auth
        signer = signer_class(self._credentials, "s3", claim.region)
        request = AWSRequest(
            method=method,
            url="http://signed" + path,
            params=[(unquote(k), unquote(v)) for k, v in pairs] or None,
        )
        for name, value in signed.items():
            request.headers[name] = value
        request.context["timestamp"] = claim.timestamp
        # without a signed X-Amz-Content-SHA256, botocore hashes the (empty) body: GET and HEAD
        canonical = signer.canonical_request(request)
        return signer.signature(signer.string_to_sign(request, canonical), request)


def _from_http_date(value: str | None) -> str:
    if not value:
        return ""
    try:
        t = parsedate_to_datetime(value).timestamp()
    except (TypeError, ValueError, IndexError, OverflowError):
        return ""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(t))
