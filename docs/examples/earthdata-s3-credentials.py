#!/usr/bin/env python3
"""A credential process for refmount's target rules: NASA Earthdata's temporary S3
credentials for one DAAC's buckets, printed in AWS's credential_process format.

    {"prefix": "s3://nsidc-cumulus-prod-protected/",
     "credentials": {"process": ["/usr/local/bin/earthdata-s3-credentials",
                                 "https://data.nsidc.earthdatacloud.nasa.gov/s3credentials"]}}

It asks the DAAC's ``s3credentials`` endpoint with an Earthdata Login bearer token, read from
the file named by ``$EARTHDATA_TOKEN_FILE`` (default ``~/.earthdata-token``; make it readable
by the mounting user only). The credentials last an hour and work only from AWS us-west-2;
refmount runs this again before they expire. Errors go to stderr, one line, exit status 1.
Standard library only.
"""

from __future__ import annotations

import json
import os
import sys
import urllib.error
import urllib.request
from datetime import UTC, datetime


def main(argv: list[str]) -> int:
    if len(argv) != 2:
        print("usage: earthdata-s3-credentials S3CREDENTIALS_URL", file=sys.stderr)
        return 2
    url = argv[1]
    path = os.environ.get("EARTHDATA_TOKEN_FILE") or os.path.expanduser("~/.earthdata-token")
    try:
        with open(path, encoding="utf-8") as f:
            token = f.read().strip()
    except OSError as e:
        print(f"cannot read the Earthdata Login token {path}: {e.strerror}", file=sys.stderr)
        return 1
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}",
                                                   "app-name": "refmount"})
    try:
        with urllib.request.urlopen(request, timeout=20) as r:
            answer = json.load(r)
        expiration = datetime.fromisoformat(answer["expiration"])  # "2026-11-26 17:00:00+00:00"
        out = {"Version": 1, "AccessKeyId": answer["accessKeyId"],
               "SecretAccessKey": answer["secretAccessKey"],
               "SessionToken": answer["sessionToken"]}
    except urllib.error.HTTPError as e:
        print(f"{url}: HTTP {e.code} {e.reason}", file=sys.stderr)
        return 1
    except (OSError, ValueError, KeyError, TypeError) as e:
        print(f"{url}: no credentials in the answer ({type(e).__name__}: {e})", file=sys.stderr)
        return 1
    if expiration.tzinfo is None:
        expiration = expiration.replace(tzinfo=UTC)
    out["Expiration"] = expiration.isoformat()
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
