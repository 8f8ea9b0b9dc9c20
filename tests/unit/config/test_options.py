"""The option table: docs/configuration.md and ``refmount --help`` list the same options with
the same defaults; the dataclass and the parser follow the table; every refusal names the
option and the problem."""

from __future__ import annotations

import dataclasses
import re
import subprocess
import sys
from pathlib import Path

import pytest

from refmount.cli.main import apply_command_options
from refmount.config import (
    OPTIONS,
    ConfigError,
    Flag,
    MountConfig,
    apply_options,
    options_markdown,
)

REPO = Path(__file__).resolve().parents[3]
DOC = REPO / "docs" / "configuration.md"


def help_options(text: str) -> dict[str, str]:
    """{spec: default} from the ``mount options (-o):`` part of ``refmount --help``."""
    section = text.split("mount options (-o):\n", 1)[1].split("\n\n", 1)[0]
    entries: list[list[str]] = []
    for line in section.splitlines():
        if line.startswith("  ") and not line.startswith("   "):
            spec, _, rest = line.strip().partition("  ")
            entries.append([spec, rest.strip()])
        else:
            entries[-1][1] += " " + line.strip()
    out = {}
    for spec, body in entries:
        m = re.search(r"\(default: (.*)\)$", " ".join(body.split()))
        assert m, f"--help entry {spec!r} shows no default: {body!r}"
        out[spec] = m.group(1)
    return out


def doc_options(text: str) -> dict[str, str]:
    """{spec: default} from the options table of docs/configuration.md."""
    table = text.split("<!-- options:begin -->", 1)[1].split("<!-- options:end -->", 1)[0]
    out = {}
    for line in table.strip().splitlines()[2:]:
        cells = [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", line)[1:-1]]
        spec, default = cells[0].strip("`"), cells[1]
        out[spec] = " ".join(default.split())
    return out


def test_docs_and_help_list_the_same_options_and_defaults():
    r = subprocess.run([sys.executable, "-m", "refmount", "--help"], capture_output=True,
                       text=True, timeout=60, env={"COLUMNS": "100", "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0, r.stderr
    in_help = help_options(r.stdout)
    in_doc = doc_options(DOC.read_text())
    assert in_doc == in_help, (
        "docs/configuration.md and refmount --help differ; run scripts/options_doc.py\n"
        f"only in --help: {sorted(set(in_help) - set(in_doc))}\n"
        f"only in the doc: {sorted(set(in_doc) - set(in_help))}\n"
        f"other defaults: {[(k, d, in_help.get(k)) for k, d in in_doc.items() if in_help.get(k) != d]}")
    assert len(in_help) == len(OPTIONS)
    assert options_markdown() in DOC.read_text(), "docs/configuration.md: run scripts/options_doc.py"


def test_dataclass_follows_the_table():
    cfg = MountConfig()
    fields = {f.name for f in dataclasses.fields(MountConfig)}
    assert fields == {o.attr for o in OPTIONS} | {"source", "mountpoint", "foreground", "serving",
                                                  "source_roots", "pins_table"}
    for o in OPTIONS:
        want = o.default() if callable(o.default) else o.default
        assert getattr(cfg, o.attr) == want, o.name
    # mutable defaults are not shared between configs
    MountConfig().remote_options["x"] = 1
    assert MountConfig().remote_options == {}


def test_every_option_parses_and_flags_take_no_value():
    samples = {"remote_protocol": "s3", "remote_options": '{"anon": true}', "uid": "12",
               "umask": "027", "attr_timeout": "1.5", "cache_size": "1G", "merge_gap": "off",
               "log": "stderr", "log_level": "WARNING", "bad_keys": "skip",
               "allow_local": "/srv:/data", "cache_dir": "/tmp/c", "block_size": "64K"}
    for o in OPTIONS:
        cfg = MountConfig()
        if isinstance(o.kind, Flag):
            apply_options(cfg, [o.name])
            assert getattr(cfg, o.attr) == o.kind.sets, o.name
            assert getattr(cfg, o.attr) != o.default, f"{o.name} changes nothing"
            with pytest.raises(ConfigError, match=f"option '{o.name}' takes no value"):
                apply_options(MountConfig(), [f"{o.name}=1"])
        else:
            needs = rf"option '{o.name}' needs a value \({re.escape(o.spec)}\)"
            with pytest.raises(ConfigError, match=needs):
                apply_options(MountConfig(), [o.name])
    cfg = MountConfig()
    apply_options(cfg, ["debug", "no_disk_cache"] + [f"{k}={v}" for k, v in samples.items()])
    assert (cfg.uid, cfg.umask, cfg.merge_gap, cfg.log_level) == (12, 0o27, -1, "warning")
    assert cfg.allow_local == ["/srv", "/data"] and cfg.remote_options == {"anon": True}
    assert cfg.debug and not cfg.disk_cache and cfg.block_size == 65536


@pytest.mark.parametrize(("opt", "message"), [
    ("bogus_opt", "unknown option 'bogus_opt' (see refmount --help)"),
    ("bogus=1", "unknown option 'bogus' (see refmount --help)"),
    ("allow_other=yes", "option 'allow_other' takes no value"),
    ("cache_size", "option 'cache_size' needs a value (cache_size=SIZE)"),
    ("cache_size=10X", "cache_size: not a size: '10X'"),
    ("retries=-1", "retries must be from 0 to 100, got '-1'"),
    ("max_connections=0", "max_connections must be from 1 to"),
    ("block_size=512", "block_size must be at least 4K, got '512'"),
    ("umask=999", "umask must be an octal number, got '999'"),
    ("timeout=inf", "timeout must be a finite number of seconds"),
    ("timeout=0", "timeout must be positive"),
    ("log_level=loud", "log_level must be debug, info, warning or error, got 'loud'"),
    ("bad_keys=maybe", "bad_keys must be error or skip, got 'maybe'"),
    ("allow_local=rel/dir", "allow_local takes absolute directories"),
    ("remote_options={secret", "remote_options is not valid JSON"),
    ("log=", "log must be stderr, syslog or a file path"),
    ("subtype=", "subtype needs a name, got nothing"),
])
def test_refusals_name_the_option_and_the_problem(opt, message):
    with pytest.raises(ConfigError) as e:
        apply_options(MountConfig(), [opt])
    assert str(e.value).startswith(message), str(e.value)
    assert "secret" not in str(e.value)


def test_refusal_on_the_command_line_is_one_line(tmp_path):
    r = subprocess.run([sys.executable, "-m", "refmount", str(tmp_path / "x.json"), str(tmp_path),
                        "-o", "ro,bogus_opt"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert r.stderr == "refmount: error: unknown option 'bogus_opt' (see refmount --help)\n"


def test_generic_mount_options_are_ignored():
    cfg = MountConfig()
    apply_options(cfg, ["ro", "_netdev", "noauto", "x-systemd.automount", "comment=x", "defaults"])
    assert cfg == MountConfig()


def test_serve_options_listen_and_token_file(tmp_path: Path) -> None:
    from refmount.base.errors import ConfigError
    from refmount.config import MountConfig, apply_options, split_listen

    cfg = MountConfig(source="/x", serving=True)
    assert cfg.listen == "127.0.0.1:8080" and cfg.local_roots() == ["/"]
    apply_options(cfg, ["listen=[::1]:0"])
    assert split_listen(cfg.listen) == ("::1", 0)
    for bad in ("8080", "host:", ":80", "h:99999", "h:x"):
        with pytest.raises(ConfigError, match="listen must be HOST:PORT"):
            apply_options(cfg, [f"listen={bad}"])
    apply_options(cfg, ["cors=https://a.example|http://b.example:8080"])
    with pytest.raises(ConfigError, match="not an origin"):
        apply_command_options(cfg, ["cors=https://a.example/path"])
    token = tmp_path / "token"
    token.write_text("abc123\n")
    apply_options(cfg, [f"auth_token=@{token}"])
    assert cfg.auth_token == str(token)  # the path is kept, never the secret
    with pytest.raises(ConfigError, match="@FILE"):
        apply_options(cfg, ["auth_token=abc123"])
    with pytest.raises(ConfigError, match="cannot read"):
        apply_options(cfg, [f"auth_token=@{tmp_path / 'missing'}"])
    token.write_text("two words")
    with pytest.raises(ConfigError, match="one token"):
        apply_options(cfg, [f"auth_token=@{token}"])


@pytest.mark.parametrize("option", ["remote_options", "target_options", "targets", "pins",
                                    "auth_token"])
def test_option_files_are_read_within_a_bound(tmp_path, option):
    """Every option's @FILE is read within a bound (``/dev/zero`` never fills memory) and a
    file that is not UTF-8 text is one line naming the option, never its content."""
    from refmount.base.optionfile import MAX_OPTION_FILE
    from refmount.targets.pins import read_pins

    def load(path) -> None:
        if option == "pins":  # read when the set is prepared (and by verify)
            read_pins(str(path))
        else:
            apply_options(MountConfig(source="refs.json", mountpoint="/mnt"), [f"{option}=@{path}"])

    zero = "is not a regular file" if option == "pins" else "is larger than"  # pins: not opened
    with pytest.raises(ConfigError, match=f"^{option}: /dev/zero {zero}"):
        load("/dev/zero")
    big = tmp_path / "big.json"
    big.write_bytes(b" " * (MAX_OPTION_FILE + 1) + b"{}")
    if option in ("remote_options", "target_options"):
        with pytest.raises(ConfigError, match="is larger than 1 MiB"):
            load(big)
    secret = tmp_path / "secret"
    secret.write_bytes(b"\xff\xfeSECRET")
    with pytest.raises(ConfigError, match=f"^{option}: .* (is|file \\() ?not (valid JSON|UTF-8 text)") as e:
        load(secret)
    assert "SECRET" not in str(e.value)
