"""The part of the environment that changes what a URL names, as one digest.

``s3://bkt/obj`` is an object of whichever service ``AWS_ENDPOINT_URL`` (or the profile's
``endpoint_url``) points at; ``abfs://container/x`` lies in the account
``AZURE_STORAGE_ACCOUNT_NAME`` names. The backends read such settings from the environment
themselves, so two mounts with the same URLs and options may read different bytes. Whatever
is keyed by a URL and outlives one mount (disk-cache blocks, persisted indexes) includes
``environment_identity()``, so that they never share bytes or indexes.

Included: the variables below, every ``FSSPEC_*`` variable, fsspec's loaded configuration
(``fsspec.config.conf``: its files and its variables, which give backends their default
options) and the content of the AWS configuration file (profiles set endpoints and regions).
Not included, because they do not change what a URL names: credentials (they decide whether
a read is allowed, not what is read), a Google Cloud project (bucket names are global),
proxies. The digest is a hash: no value is ever written or logged.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from typing import Any

NAMING_VARIABLES = (
    # botocore (s3fs): the endpoint, or the profile and region that choose it (a region also
    # chooses the partition: aws, aws-cn, aws-us-gov have separate bucket namespaces).
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
    "AWS_IGNORE_CONFIGURED_ENDPOINT_URLS",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_CONFIG_FILE",
    # gcsfs: an emulator or another endpoint.
    "STORAGE_EMULATOR_HOST",
    "GCS_ENDPOINT_URL",
    # adlfs: the storage account (the namespace of containers) and its endpoint.
    "AZURE_STORAGE_ACCOUNT_NAME",
    "AZURE_STORAGE_ACCOUNT",
    "AZURE_STORAGE_CONNECTION_STRING",
    # huggingface_hub (hf://): the hub's address.
    "HF_ENDPOINT",
)


def environment_identity(environ: Mapping[str, str] | None = None,
                         fsspec_config: Mapping[str, Any] | None = None) -> str:
    """A digest (32 hex digits) of what in ``environ`` (default: this process's environment)
    and fsspec's configuration (default: ``fsspec.config.conf``) changes what a URL names."""
    env = os.environ if environ is None else environ
    if fsspec_config is None:
        import fsspec.config

        fsspec_config = fsspec.config.conf
    named = {k: env[k] for k in NAMING_VARIABLES if k in env}
    named.update((k, v) for k, v in env.items() if k.startswith("FSSPEC_"))
    blob = json.dumps([named, fsspec_config, _aws_config_digest(env)], sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:32]


def _aws_config_digest(env: Mapping[str, str]) -> str | None:
    path = env.get("AWS_CONFIG_FILE") or os.path.join(env.get("HOME") or os.path.expanduser("~"),
                                                      ".aws", "config")
    try:
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(1 << 20)).hexdigest()
    except OSError:
        return None
