"""Credentials off the command line (refmount/cli/cmdline.py): what is masked, that the process's
own /proc/PID/cmdline is rewritten argument by argument, and ``--env``'s configuration."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from refmount.base.errors import ConfigError
from refmount.cli.cmdline import (
    ENV_OPTIONS,
    ENV_SOURCE,
    configuration_environment,
    masked_argument,
    masked_arguments,
    secrets_in,
    take_configuration,
)
from refmount.cli.main import config_from_args

SECRET = "SENTINEL-c0ffee"
REPO = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("arg, shown", [
    (f"https://user:{SECRET}@host/refs.json", "https://***@host/refs.json"),
    (f"s3://b/refs.json?X-Amz-Signature={SECRET}", "s3://b/refs.json?X-Amz-Signature=***"),
    (f'remote_options={{"key": "{SECRET}"}},timeout=3', "remote_options=***,timeout=3"),
    (f'-otarget_options={{"headers": {{"X": "{SECRET}"}}}}', "-otarget_options=***"),
    (f'ro,remote_options={{"a": ["{SECRET}", 1]}},target_options={{"b": 2}}',
     "ro,remote_options=***,target_options=***"),
    ("remote_options=@/etc/refmount/s3.json", "remote_options=@/etc/refmount/s3.json"),
    ("/mnt/data", "/mnt/data"),
    ("-f", "-f"),
])
def test_masked_arguments(arg, shown):
    assert masked_argument(arg) == shown
    assert SECRET not in masked_argument(arg)


def test_the_tools_target_options_are_masked():
    args = ["refmount", "inspect", "s3://b/r.json", "--target-options", f'{{"key": "{SECRET}"}}',
            f'--target-options={{"secret": "{SECRET}"}}', "--target-options", "@/etc/x.json"]
    assert masked_arguments(args) == ["refmount", "inspect", "s3://b/r.json", "--target-options",
                                      "***", "--target-options=***", "--target-options",
                                      "@/etc/x.json"]
    assert "inline remote_options/target_options JSON" in secrets_in(args)


def test_only_credentials_warn():
    assert secrets_in(["refmount", "/srv/r.json", "/mnt", "-o", 'remote_options={"anon": true}']) == []
    assert secrets_in(["-o", 'remote_options={"key": "x"}']) == ["inline remote_options/target_options JSON"]
    assert secrets_in([f"http://u:{SECRET}@h/r.json"]) == ["a password, token or signature"]
    assert secrets_in(["-o", "remote_options={not json"]) == ["inline remote_options/target_options JSON"]


def test_the_process_command_line_is_rewritten_argument_by_argument(tmp_path):
    """A fresh interpreter with secrets in argv masks them: /proc/PID/cmdline (read by another
    process) keeps every argument, masked, and the warning names what was there."""
    code = ("import sys, time; from refmount.cli.cmdline import hide_credentials; "
            "w = hide_credentials(); print(w, flush=True); sys.stdin.read()")
    argv = [sys.executable, "-c", code, f"http://u:{SECRET}@h/r.json", "/mnt/x", "-o",
            f'remote_options={{"client_kwargs": {{"headers": {{"Authorization": "{SECRET}"}}}}}},ro']
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    try:
        warning = proc.stdout.readline()
        cmdline = Path(f"/proc/{proc.pid}/cmdline").read_bytes()
    finally:
        proc.communicate("", timeout=30)
    assert SECRET.encode() not in cmdline
    args = cmdline.rstrip(b"\0").split(b"\0")
    assert args == [a.encode() for a in argv[:3]] + [b"http://***@h/r.json", b"/mnt/x", b"-o",
                                                      b"remote_options=***,ro"]
    assert "inline remote_options" in warning and "password" in warning and SECRET not in warning


def test_nothing_to_hide_leaves_the_command_line_alone():
    code = "from refmount.cli.cmdline import hide_credentials; print(hide_credentials())"
    r = subprocess.run([sys.executable, "-c", code, "/srv/r.json", "/mnt", "-o",
                        'remote_options={"anon": true}'], capture_output=True, text=True,
                       cwd=REPO, timeout=30)
    assert r.stdout.strip() == "None", r.stderr


def _args(*positional: str | None, env: bool = True, options: list[str] | None = None
          ) -> argparse.Namespace:
    source, mountpoint = [*positional, None, None][:2]
    return argparse.Namespace(source=source, mountpoint=mountpoint, options=options or [],
                              debug=False, foreground=True, env=env)


def test_env_configuration_is_taken_out_of_the_environment(tmp_path):
    opts = [f'remote_options={json.dumps({"key": SECRET})}', "timeout=7"]
    environ = configuration_environment("s3://bucket/refs.json", opts, base={"PATH": "/bin"})
    cfg = config_from_args(_args(str(tmp_path), options=["timeout=9"]), environ)
    assert cfg.source == "s3://bucket/refs.json"
    assert cfg.mountpoint == str(tmp_path)
    assert cfg.remote_options == {"key": SECRET}
    assert cfg.timeout == 9  # the command line's -o comes after the environment's
    assert environ == {"PATH": "/bin"}, "the children would inherit the configuration"


def test_env_needs_source_and_takes_only_the_mountpoint(tmp_path):
    with pytest.raises(ConfigError, match=ENV_SOURCE):
        config_from_args(_args(str(tmp_path)), {})
    with pytest.raises(ConfigError, match="only MOUNTPOINT"):
        config_from_args(_args("/srv/r.json", str(tmp_path)), {ENV_SOURCE: "/srv/r.json"})
    with pytest.raises(ConfigError, match="SOURCE and MOUNTPOINT"):
        config_from_args(_args(str(tmp_path), env=False), {})
    assert take_configuration({ENV_OPTIONS: "ro"}) == (None, ["ro"])


@pytest.mark.parametrize("argv, hint", [
    (["refs.json", "/mnt/x", "--decode"], "did you mean '-o decode'?"),
    (["serve", "refs.json", "--decode"], "did you mean '-o decode'?"),
    (["refs.json", "/mnt/x", "--max-chunk-bytes=5"], "did you mean '-o max_chunk_bytes=5'?"),
])
def test_an_option_given_as_a_flag_gets_a_did_you_mean(argv, hint):
    r = subprocess.run([sys.executable, "-m", "refmount", *argv], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith(hint), r.stderr
    r = subprocess.run([sys.executable, "-m", "refmount", "refs.json", "/mnt/x", "--no-such-flag"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "did you mean" not in r.stderr, r.stderr


def test_help_names_icechunk_repositories_and_serve():
    from refmount.cli.main import _parser

    text = " ".join(_parser().format_help().split())
    assert "Icechunk repository" in text and "refmount serve SOURCE" in text, text[:400]


def test_stats_of_a_server_speak_of_http_not_fuse():
    from refmount.cli.tools import format_stats

    mount = format_stats({"lookups": 3, "opens": 2, "reads": 5, "open_files": 1, "errors": 0})
    assert "FUSE lookups" in mount and "FUSE reads" in mount
    served = format_stats({"lookups": 0, "opens": 0, "reads": 5, "open_files": 0, "pushed": 0,
                           "errors": 0, "http_requests": 7, "http_status": {"200": 7}})
    assert "FUSE" not in served and "open files" not in served, served
    assert "key reads" in served and "HTTP requests" in served
