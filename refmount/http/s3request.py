"""How the S3 dialect (``http/s3dialect.py``) reads a request: the query's pairs (bounded), the
sub-resources that name operations it does not implement, the errors it answers with, and the
bucket name of a set served alone."""

from __future__ import annotations

import re
import urllib.parse

__all__ = [
    "MAX_KEYS",
    "MAX_KEY_BYTES",
    "RESPONSE_OVERRIDES",
    "SUBRESOURCES",
    "S3Error",
    "bucket_name",
    "query_pairs",
    "query_value",
]

MAX_QUERY_FIELDS = 64
MAX_KEY_BYTES = 1024  # S3's longest key; prefixes and markers too
MAX_KEYS = 1000
SUBRESOURCES = frozenset(
    [
        "accelerate",
        "acl",
        "analytics",
        "attributes",
        "cors",
        "delete",
        "encryption",
        "intelligent-tiering",
        "inventory",
        "legal-hold",
        "lifecycle",
        "logging",
        "metrics",
        "notification",
        "object-lock",
        "ownershipControls",
        "partNumber",
        "policy",
        "policyStatus",
        "publicAccessBlock",
        "replication",
        "requestPayment",
        "restore",
        "retention",
        "select",
        "tagging",
        "torrent",
        "uploadId",
        "uploads",
        "versionId",
        "versioning",
        "versions",
        "website",
    ]
)
RESPONSE_OVERRIDES = {
    "response-content-type": "Content-Type",
    "response-content-language": "Content-Language",
    "response-expires": "Expires",
    "response-cache-control": "Cache-Control",
    "response-content-disposition": "Content-Disposition",
    "response-content-encoding": "Content-Encoding",
}


def bucket_name(source: str) -> str:
    """A bucket name for a set served alone, from its SOURCE's last component: lower case,
    ``[a-z0-9.-]``, 3 to 63 characters (``refmount`` when nothing usable is left)."""
    name = source.rstrip("/").rpartition("/")[2].lower()
    for suffix in (".json", ".parquet", ".parq", ".zarr", ".icechunk"):
        name = name.removesuffix(suffix)
    name = re.sub(r"[^a-z0-9.-]+", "-", name).strip("-.")[:63].strip("-.")
    return name if len(name) >= 3 else "refmount"


class S3Error(Exception):
    """An S3 error answer: its status, code, message and extra elements."""

    def __init__(self, status: int, code: str, message: str, **extra: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.extra = status, code, message, extra


def query_pairs(raw: str) -> list[tuple[str, str]]:
    """The raw query's pairs, still %-encoded; bounded in number."""
    if not raw:
        return []
    parts = raw.split("&")
    if len(parts) > MAX_QUERY_FIELDS:
        raise S3Error(400, "InvalidArgument", f"more than {MAX_QUERY_FIELDS} query parameters")
    return [(k, v) for k, _, v in (p.partition("=") for p in parts) if k]


def query_value(raw: str) -> bytes:
    """A query value as bytes (``+`` is a space, as S3 reads it)."""
    return urllib.parse.unquote_to_bytes(raw.replace("+", "%20"))
