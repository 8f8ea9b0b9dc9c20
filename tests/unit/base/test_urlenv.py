"""``environment_identity``: what in the environment changes what a URL names, as a digest."""

from __future__ import annotations

from pathlib import Path

from refmount.base.urlenv import environment_identity


def test_naming_variables_change_the_identity_and_others_do_not(tmp_path: Path) -> None:
    home = {"HOME": str(tmp_path)}  # no AWS configuration file there

    def ident(**env: str) -> str:
        return environment_identity({**home, **env}, {})

    base = ident()
    changed = [
        ident(AWS_ENDPOINT_URL="http://127.0.0.1:9000"),
        ident(AWS_ENDPOINT_URL="http://127.0.0.1:9001"),
        ident(AWS_ENDPOINT_URL_S3="http://127.0.0.1:9000"),
        ident(AWS_PROFILE="minio"),
        ident(AWS_DEFAULT_REGION="cn-north-1"),
        ident(STORAGE_EMULATOR_HOST="http://127.0.0.1:4443"),
        ident(AZURE_STORAGE_ACCOUNT_NAME="other"),
        ident(FSSPEC_S3_ENDPOINT_URL="http://127.0.0.1:9000"),
        ident(HF_ENDPOINT="https://hub.example"),
    ]
    assert len({base, *changed}) == len(changed) + 1
    # credentials, paths and the like leave it as it is: mounts still share their cache
    assert ident(AWS_ACCESS_KEY_ID="AKIA", AWS_SECRET_ACCESS_KEY="s", PATH="/bin", LANG="C") == base
    assert environment_identity(home, {"s3": {"endpoint_url": "http://x"}}) != base
    assert len(base) == 32 and "9000" not in ident(AWS_ENDPOINT_URL="http://127.0.0.1:9000")


def test_the_aws_configuration_file_is_part_of_it(tmp_path: Path) -> None:
    """A profile's ``endpoint_url`` lives in ~/.aws/config (or AWS_CONFIG_FILE)."""
    home = {"HOME": str(tmp_path)}
    before = environment_identity(home, {})
    (tmp_path / ".aws").mkdir()
    (tmp_path / ".aws" / "config").write_text("[default]\nendpoint_url = http://127.0.0.1:9000\n")
    after = environment_identity(home, {})
    (tmp_path / "other").write_text("[default]\nendpoint_url = http://127.0.0.1:9001\n")
    elsewhere = environment_identity({**home, "AWS_CONFIG_FILE": str(tmp_path / "other")}, {})
    assert len({before, after, elsewhere}) == 3
