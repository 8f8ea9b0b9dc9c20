"""Hostile input: reference sets that are malformed, try to escape or break the tree,
attack the jinja sandbox, name unknown protocols, or carry broken Parquet record files.

The contract for a bad set (``mount_fails``): exit non-zero, exactly one ``refmount: error:``
line naming the problem, no mount and no daemon left. ``bad_keys=skip`` and Parquet record
files (read lazily) have documented safe behaviour instead: skipped keys with a warning, and
EIO for the affected chunks only.

Many cases per test run concurrently (each is a CLI process) to keep the suite fast; every
failing case is reported, not only the first.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from _pytest.outcomes import Failed
from support.mounts import CLI, REPO, cli_env, daemon_procs, is_mounted, opts_arg, run_cli

pytestmark = [pytest.mark.fuse, pytest.mark.timeout(600)]

INT64_MAX = 2**63 - 1


# --- helpers -------------------------------------------------------------------------------------


def write(path: Path, content: str | bytes | dict | list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


@pytest.fixture
def target(tmp_path) -> Path:
    """A real local file next to the reference sets (so only the tested problem is wrong)."""
    return write(tmp_path / "data" / "target.bin", bytes(range(256)) * 16)


# source, options, words the error must name (a tuple among them: any one of its words)
Case = tuple[Path, tuple[str, ...], tuple[str | tuple[str, ...], ...]]


def check_error(mount_fails, src, opts, mention, mnt) -> str:
    """The error contract: exit non-zero; stderr is exactly one ``refmount: error:`` line
    (``refmount: WARNING:`` lines aside) naming the problem; no mount, no daemon left."""
    m = mount_fails.track(src, *opts, mnt=mnt, debug_log=False)
    r = m.result = run_cli(str(src), str(mnt), *opts_arg(m.opts))
    m.refresh_procs()
    lines = [ln for ln in r.stderr_lines if not ln.startswith("refmount: WARNING:")]
    assert r.returncode != 0, f"expected failure, got exit 0; stderr: {r.stderr!r}"
    assert len(lines) == 1 and lines[0].startswith("refmount: error:"), (
        f"expected one 'refmount: error:' line, got:\n{r.stderr}")
    line = lines[0]
    for words in mention:
        alternatives = (words,) if isinstance(words, str) else words
        assert any(w.lower() in line.lower() for w in alternatives), (
            f"error line does not mention {' or '.join(map(repr, alternatives))}: {line}")
    assert not is_mounted(mnt), f"{mnt} is mounted after a failed refmount"
    left = [p.pid for p in daemon_procs(mnt)]
    assert not left, f"processes left behind for {mnt}: {left}"
    return line


def expect_errors(mount_fails, cases: dict[str, Case], workers: int = 4) -> dict[str, str]:
    """Run every case (concurrently, each a CLI process); returns name -> error line."""
    mnts = {name: mount_fails.new_mountpoint("fail") for name in cases}

    def one(name: str) -> tuple[str, str | None, str | None]:
        src, opts, mention = cases[name]
        try:
            return name, check_error(mount_fails, src, opts, mention, mnts[name]), None
        except (AssertionError, Failed) as e:
            return name, None, str(e)

    with ThreadPoolExecutor(workers) as ex:
        results = list(ex.map(one, cases))
    problems = [f"[{name}] {err}" for name, _line, err in results if err]
    assert not problems, f"{len(problems)} of {len(cases)} cases broke the contract:\n\n" + \
        "\n\n".join(problems)
    return {name: line for name, line, _err in results if line is not None}


def v0_cases(tmp_path: Path, values: dict[str, object], key: str = "bad/key",
             mention: tuple | None = None) -> dict[str, Case]:
    """One Version 0 set per value: a good key, and ``key`` with the value."""
    out = {}
    for i, (name, value) in enumerate(values.items()):
        src = write(tmp_path / f"v0-{i}.json", {"ok/file": "fine", key: value})
        out[name] = (src, (), mention if mention is not None else (key,))
    return out


# --- malformed documents ---------------------------------------------------------------------------


def test_malformed_json_and_non_object_top_level(mount_fails, tmp_path):
    docs = {
        "truncated": ('{"a": "b",', ("json",)),
        "bad-bracket": ('{"a": [1, 2}', ("json",)),
        "garbage": ("\x00\x01\x02binary", ("json",)),
        "v1-refs-truncated": ('{"version": 1, "refs": {"a": "b"', ("json",)),
        "array": ('["a", "b"]', ("object",)),
        "number": ("42", ("object",)),
    }
    cases = {name: (write(tmp_path / f"{name}.json", text), (), mention)
             for name, (text, mention) in docs.items()}
    expect_errors(mount_fails, cases)


def test_version_other_than_0_or_1(mount_fails, tmp_path):
    """Version 1, or Version 0 written with its number (``{"version": 0, "refs": …}``, nothing
    of Version 1's beside it): anything else is refused naming the version."""
    versions = {"2": 2, "string-1": "1", "null": None, "true": True, "float-1.5": 1.5}
    cases = {
        name: (write(tmp_path / f"ver-{i}.json", {"version": v, "refs": {"a": "b"}}), (),
               ("version",))
        for i, (name, v) in enumerate(versions.items())
    }
    cases["0-with-templates"] = (write(tmp_path / "ver-0t.json", {
        "version": 0, "templates": {"u": "x"}, "refs": {"a": "b"}}), (), ("version 0", "templates"))
    expect_errors(mount_fails, cases)


def test_gen_with_offset_but_no_length(mount_fails, tmp_path, target):
    gen = {"key": "v/{{i}}", "url": str(target), "dimensions": {"i": {"stop": 3}}}
    cases = {
        "offset-only": (write(tmp_path / "g1.json", {"version": 1, "gen": [{**gen, "offset": "0"}]}),
                        (), ("gen[0]", "length")),
        "length-only": (write(tmp_path / "g2.json", {"version": 1, "gen": [{**gen, "length": "1"}]}),
                        (), ("gen[0]", "offset")),
    }
    expect_errors(mount_fails, cases)


def test_bad_offsets_and_lengths(mount_fails, tmp_path, target):
    url = str(target)
    values = {
        "offset-float": [url, 1.5, 10],
        "offset-string": [url, "0", 10],
        "offset-bool": [url, True, 10],
        "offset-negative": [url, -1, 10],
        "length-negative": [url, 0, -5],
        "length-float": [url, 0, 2.5],
        "offset-2**63": [url, 2**63, 1],
        "offset-2**64": [url, 2**64, 1],
        "length-2**63": [url, 0, 2**63],
        "sum-overflows": [url, INT64_MAX - 10, 100],
    }
    # Beyond 64 bits the JSON parser may stop first, pointing at the number: also clear.
    too_big = {"offset-2**63", "offset-2**64", "length-2**63"}
    cases = v0_cases(tmp_path, {k: v for k, v in values.items() if k not in too_big})
    cases |= v0_cases(tmp_path / "big", {k: v for k, v in values.items() if k in too_big},
                      mention=(("bad/key", "overflow"),))
    # the same in Version 1 refs, and rendered by gen
    cases["v1-refs-negative"] = (write(tmp_path / "v1neg.json", {
        "version": 1, "refs": {"bad/key": [url, -3, 10]}}), (), ("bad/key",))
    gen = {"key": "g/{{i}}", "url": url, "dimensions": {"i": {"stop": 3}}}
    gens = {
        "gen-negative": {"offset": "{{ i - 1 }}", "length": "10"},
        "gen-overflow": {"offset": "{{ 2**70 }}", "length": "10"},
        "gen-sum-overflow": {"offset": str(INT64_MAX - 5), "length": "{{ 10 + i }}"},
        "gen-not-integer": {"offset": "0", "length": "ten{{i}}"},
        "gen-float": {"offset": "{{ i / 2 }}", "length": "1"},
    }
    for i, (name, fields) in enumerate(gens.items()):
        cases[name] = (write(tmp_path / f"gen-{i}.json",
                             {"version": 1, "gen": [{**gen, **fields}]}), (), ("gen[0]",))
    cases["gen-dimension-overflow"] = (write(tmp_path / "gen-dim.json", {
        "version": 1, "gen": [{**gen, "dimensions": {"i": {"stop": 2**70}}}]}), (),
        (("gen[0]", "overflow"),))
    cases["gen-dimension-list-overflow"] = (write(tmp_path / "gen-dimlist.json", {
        "version": 1, "gen": [{**gen, "dimensions": {"i": [1, 2**70]}}]}), (),
        ("gen[0].dimensions.i",))
    expect_errors(mount_fails, cases)


# --- keys that try to escape or break the tree -------------------------------------------------------

LONG = "x" * 256
LONG_UTF8 = "\u00e9" * 128  # 128 characters, 256 bytes
BAD_KEYS = {
    "dotdot-escape": ("../x", ("'../x'",)),
    "dotdot-inside": ("a/../../x", ("'a/../../x'",)),
    "root-twice": ("//abs", ("'//abs'",)),  # one leading '/' means the root; two do not
    "double-slash": ("a//b", ("'a//b'",)),
    "trailing-slash": ("a/", ("'a/'",)),
    "dot": (".", ("'.'",)),
    "empty": ("", ("empty",)),
    "nul": ("a\x00b", ("NUL",)),
    "component-256-bytes": (f"d/{LONG}", ("255",)),
    "component-256-utf8-bytes": (f"d/{LONG_UTF8}", ("255",)),
}


def test_keys_that_escape_or_break_the_tree(mount_fails, tmp_path):
    cases = {}
    for i, (name, (key, mention)) in enumerate(BAD_KEYS.items()):
        cases[name] = (write(tmp_path / f"key-{i}.json", {"ok/file": "fine", key: "value"}), (),
                       ("key", *mention))
    cases["file-and-directory"] = (
        write(tmp_path / "clash.json", {"a": "file", "a/b": "under it", "ok": "x"}), (),
        ("'a'", "both a file and a directory"))
    cases["file-and-deep-directory"] = (
        write(tmp_path / "clash2.json", {"p/q": "file", "p/q/r/s": "deep", "ok": "x"}), (),
        ("'p/q'", "both a file and a directory"))
    cases["v1-refs-escape"] = (
        write(tmp_path / "v1key.json", {"version": 1, "refs": {"../../etc/x": "v"}}), (),
        ("../../etc/x",))
    cases["gen-key-escape"] = (write(tmp_path / "genkey.json", {"version": 1, "gen": [
        {"key": "../up/{{i}}", "url": "/dev/null", "dimensions": {"i": {"stop": 2}}}]}), (),
        ("../up/0",))
    cases["gen-key-absolute"] = (write(tmp_path / "genabs.json", {"version": 1, "gen": [
        {"key": "//root/{{i}}", "url": "/dev/null", "dimensions": {"i": [4]}}]}), (),
        ("//root/4",))
    expect_errors(mount_fails, cases)


def test_component_of_255_bytes_is_fine(mount, tmp_path):
    name = "y" * 251 + "\u00e9\u00e9"  # 255 bytes in UTF-8
    src = write(tmp_path / "ok255.json", {f"d/{name}": "edge", "e": "x"})
    m = mount(src, "no_disk_cache")
    assert os.listdir(m / "d") == [name]
    assert (m / "d" / name).read_bytes() == b"edge"


def test_bad_keys_skip_mounts_the_rest_with_a_warning(mount, tmp_path):
    refs = {key: f"bad {i}" for i, (key, _m) in enumerate(BAD_KEYS.values())}
    refs |= {"a": "file", "a/b": "under a", "good/one": "1", "good/two": "base64:dHdv", ".zgroup": "{}"}
    src = write(tmp_path / "mixed.json", refs)
    m = mount(src, "no_disk_cache", "bad_keys=skip")
    assert m.result is not None
    warned = [ln for ln in m.result.stderr.splitlines() if "skipped" in ln]
    assert warned and "WARNING" in warned[0], m.result.stderr
    found = set()
    for dirpath, _dirs, files in os.walk(m.path):
        rel = os.path.relpath(dirpath, m.path)
        found |= {f if rel == "." else f"{rel}/{f}" for f in files}
    assert found == {"a/b", "good/one", "good/two", ".zgroup"}, found
    assert (m / "good/two").read_bytes() == b"two"
    assert (m / "a/b").read_bytes() == b"under a"


# --- values: base64, huge inline -----------------------------------------------------------------------


def test_bad_base64(mount_fails, tmp_path):
    payloads = {"bad-padding": "abc", "not-alphabet": "%%%%", "junk-tail": "Zm9v!!!!",
                "non-ascii": "Zm9v\u00e9A=="}
    expect_errors(mount_fails, v0_cases(tmp_path, {k: "base64:" + v for k, v in payloads.items()}))


def test_utf16_surrogate_escapes(mount, mount_fails, tmp_path):
    """A JSON key with a lone surrogate escape is not Unicode text: refused, not renamed
    (yajl turned it into '?'); a surrogate pair (an emoji, as json.dumps writes it) is one
    character and mounts under its UTF-8 name."""
    lone_key = tmp_path / "lone-key.json"
    lone_key.write_text('{"ok": "fine", "a\\ud800b": "x"}')
    lone_value = tmp_path / "lone-value.json"
    lone_value.write_text('{"ok": "fine", "v": "\\udc00z"}')
    expect_errors(mount_fails, {"lone-key": (lone_key, (), ("not valid Unicode",)),
                                "lone-value": (lone_value, (), ("not valid Unicode",))})
    pair = write(tmp_path / "pair.json", {"d/c\U0001f600": "smile", "e": "\u00e9"})
    assert "\\ud83d\\ude00" in pair.read_text()
    m = mount(pair, "no_disk_cache")
    assert os.listdir(m / "d") == ["c\U0001f600"]
    assert (m / "d" / "c\U0001f600").read_bytes() == b"smile"
    assert (m / "e").read_bytes() == "\u00e9".encode()


def test_line_wrapped_base64_is_decoded(mount, tmp_path):
    """base64 with line breaks (base64.encodebytes, MIME) is valid base64; junk is not
    (test_bad_base64)."""
    import base64

    blob = bytes(range(256)) * 3
    wrapped = base64.encodebytes(blob).decode()
    assert "\n" in wrapped.strip()
    src = write(tmp_path / "wrapped.json", {"w": "base64:" + wrapped, "crlf": "base64:Zm9v\r\nYmFy\r\n"})
    m = mount(src, "no_disk_cache")
    assert (m / "w").read_bytes() == blob
    assert (m / "crlf").read_bytes() == b"foobar"


def test_huge_inline_value_is_served_exactly(mount, tmp_path):
    """A 32 MiB inline value (43 MiB of base64 in the JSON): mounted, sized and served
    byte for byte."""
    import base64

    blob = os.urandom(32 * 2**20)
    src = tmp_path / "huge.json"
    with open(src, "w") as f:
        f.write('{"small": "s", "big/blob": "base64:')
        f.write(base64.b64encode(blob).decode())
        f.write('"}')
    m = mount(src, "no_disk_cache")
    assert os.stat(m / "big/blob").st_size == len(blob)
    h = hashlib.sha256()
    with open(m / "big/blob", "rb") as f:
        while chunk := f.read(4 << 20):
            h.update(chunk)
    assert h.hexdigest() == hashlib.sha256(blob).hexdigest()
    assert (m / "small").read_bytes() == b"s"


# --- jinja: sandboxed, time-bounded ------------------------------------------------------------------


def _code_execution_payloads(marker: Path) -> dict[str, str]:
    payloads = {
        "mro-subclasses": "{{ ''.__class__.__mro__[1].__subclasses__() }}",
        "cycler-globals": "{{ cycler.__init__.__globals__.os.popen('CMD').read() }}",
        "lipsum-globals": "{{ lipsum.__globals__['os'].popen('CMD').read() }}",
        "joiner-globals": "{{ joiner.__init__.__globals__['os'].system('CMD') }}",
        "self-globals": "{{ self.__init__.__globals__['__builtins__'] }}",
        "format-string": "{{ '{0.__class__.__mro__}'.format(1) }}",
        "namespace-class": "{% set n = namespace() %}{{ n.__class__.__init__.__globals__ }}",
        "import-in-template": "{% import 'os' as os %}{{ os.system('CMD') }}",
    }
    return {k: v.replace("CMD", f"touch {marker}") for k, v in payloads.items()}


LOOPS = {
    "range-too-big": "{% for i in range(10**9) %}x{% endfor %}",
    "nested-loops": "{% for a in range(99999) %}{% for b in range(99999) %}{% endfor %}{% endfor %}",
    "self-growing-list": "{% set l = [1] %}{% for x in l %}{{ l.append(x) }}{% endfor %}",
    "recursive-macro": "{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}",
    "huge-repetition": "{{ 'a' * 10**12 }}",
    "huge-power": "{{ 2 ** 100000000 }}",
}


def test_jinja_code_execution_is_refused(mount_fails, tmp_path):
    marker = tmp_path / "PWNED"
    cases = {}
    for i, (name, payload) in enumerate(_code_execution_payloads(marker).items()):
        # in a template function called from a refs URL
        cases[name] = (write(tmp_path / f"exec-{i}.json", {
            "version": 1, "templates": {"t": payload}, "refs": {"k": ["{{ t() }}", 0, 1]}}),
            (), ())
    cases["in-refs-url"] = (write(tmp_path / "exec-url.json", {
        "version": 1, "refs": {"k": [_code_execution_payloads(marker)["lipsum-globals"], 0, 1]}}),
        (), ())
    cases["in-gen-key"] = (write(tmp_path / "exec-genkey.json", {"version": 1, "gen": [{
        "key": "v/{{ i }}" + _code_execution_payloads(marker)["cycler-globals"],
        "url": "/dev/null", "dimensions": {"i": {"stop": 2}}}]}), (), ("gen[0]",))
    cases["in-gen-offset"] = (write(tmp_path / "exec-genoff.json", {"version": 1, "gen": [{
        "key": "v/{{ i }}", "url": "/dev/null", "dimensions": {"i": {"stop": 2}},
        "offset": _code_execution_payloads(marker)["mro-subclasses"], "length": "1"}]}),
        (), ("gen[0]",))
    expect_errors(mount_fails, cases)
    assert not marker.exists(), "a template ran a shell command"


def test_jinja_unbounded_loops_are_stopped_in_time(mount_fails, tmp_path):
    cases = {
        name: (write(tmp_path / f"loop-{i}.json", {
            "version": 1, "templates": {"t": payload}, "refs": {"k": ["{{ t() }}", 0, 1]}}),
            (), ())
        for i, (name, payload) in enumerate(LOOPS.items())
    }
    cases["gen-key-loop"] = (write(tmp_path / "loop-gen.json", {"version": 1, "gen": [{
        "key": "v/{{ i }}" + LOOPS["nested-loops"], "url": "/dev/null",
        "dimensions": {"i": {"stop": 2}}}]}), (), ("gen[0]",))
    lines = expect_errors(mount_fails, cases, workers=3)
    slow = {n: ln for n, ln in lines.items() if n in ("nested-loops", "self-growing-list")}
    for name, line in slow.items():
        assert "longer than" in line or "template" in line, (name, line)
    for r in mount_fails.mounts:
        assert r.result is not None and r.result.seconds < 20, (r.source, r.result.seconds)


# One operation each that builds a huge value from a few bytes of template: C code that no
# watchdog can interrupt, so each must be refused before it runs.
SIZE_BOMBS = {
    "loop-of-repetitions": "{% for i in range(99999) %}{{ 'x' * 1000000 }}{% endfor %}",
    "percent-width": "{{ '%0900000000d' % 1 }}",
    "percent-precision": "{{ '%.900000000f' % 1.5 }}",
    "percent-star-width": "{{ '%*d' % (900000000, 1) }}",
    "format-filter-width": "{{ '%0900000000d'|format(1) }}",
    "str-format-width": "{{ '{:>900000000}'.format(1) }}",
    "str-format-nested-width": "{{ '{:>{w}}'.format(1, w=900000000) }}",
    "format-map-width": "{{ '{a:>900000000}'.format_map({'a': 1}) }}",
    "str-center": "{{ 'x'.center(900000000) }}",
    "str-zfill": "{{ '1'.zfill(900000000) }}",
    "str-expandtabs": "{{ ('\t' * 1000000).expandtabs(1000) }}",
    "str-replace-empty": "{{ ('a' * 1000000).replace('', 'b' * 1000) }}",
    "str-join": "{{ ('a' * 1000000).join(['b' * 1000] * 1000) }}",
    "join-filter": "{{ (['a' * 1000000] * 1000)|join }}",
    "center-filter": "{{ 'x'|center(900000000) }}",
    "indent-filter": "{{ ('a\n' * 100000)|indent(100000) }}",
    "replace-filter": "{{ ('a' * 1000000)|replace('a', 'b' * 1000) }}",
    "slice-filter": "{{ [1]|slice(900000000)|list|length }}",
    "batch-filter": "{{ [1]|batch(900000000, 0)|list|length }}",
    "plus-doubling": "{% set n = namespace(s='ab') %}{% for i in range(40) %}"
                     "{% set n.s = n.s + n.s %}{% endfor %}{{ n.s|length }}",
    "tilde-doubling": "{% set n = namespace(s='ab') %}{% for i in range(40) %}"
                      "{% set n.s = n.s ~ n.s %}{% endfor %}{{ n.s|length }}",
    "list-doubling": "{% set n = namespace(l=[1]) %}{% for i in range(40) %}"
                     "{% set n.l = n.l + n.l %}{% endfor %}{{ n.l|length }}",
    "int-squaring": "{% set n = namespace(x=3) %}{% for i in range(40) %}"
                    "{% set n.x = n.x * n.x %}{% endfor %}{{ n.x % 10 }}",
    "int-power-tower": "{{ ((2 ** 1000) ** 1000) ** 1000 % 7 }}",
    "lipsum": "{{ lipsum(100000000) }}",
}


def _cli_under_memory_limit(src: Path, mnt: Path) -> tuple[int, int, str]:
    """Runs the CLI under a 3 GiB RLIMIT_DATA (so that a test cannot hurt the machine);
    returns (exit code, peak RSS in KiB, stderr)."""
    wrapper = (
        "import resource, subprocess, sys\n"
        "def limit():\n"
        "    resource.setrlimit(resource.RLIMIT_DATA, (3 << 30, 3 << 30))\n"
        "r = subprocess.run(sys.argv[1:], preexec_fn=limit, capture_output=True, text=True)\n"
        "sys.stderr.write(r.stderr)\n"
        "print(r.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    r = subprocess.run([sys.executable, "-c", wrapper, *CLI, str(src), str(mnt), "-o", "no_disk_cache"],
                       capture_output=True, text=True, timeout=120, env=cli_env(), cwd=str(REPO))
    rc, maxrss_kb = map(int, r.stdout.split())
    return rc, maxrss_kb, r.stderr


def test_jinja_size_bombs_are_refused_before_they_run(tmp_path):
    """Each bomb fails the mount with one error line, and the CLI's peak memory stays far
    below what the bomb would have built (900 MB and up), in a template function and
    directly in a refs URL."""
    cases = {}
    for i, (name, payload) in enumerate(SIZE_BOMBS.items()):
        doc = ({"version": 1, "templates": {"t": payload}, "refs": {"k": ["{{ t() }}", 0, 1]}}
               if i % 2 else {"version": 1, "refs": {"k": ["/dev/null" + payload, 0, 1]}})
        mnt = tmp_path / f"mnt-{i}"
        mnt.mkdir()
        cases[name] = (write(tmp_path / f"bomb-{i}.json", doc), mnt)

    def one(name: str) -> str | None:
        src, mnt = cases[name]
        rc, maxrss_kb, stderr = _cli_under_memory_limit(src, mnt)
        lines = [ln for ln in stderr.splitlines() if not ln.startswith("refmount: WARNING:")]
        if is_mounted(mnt):
            subprocess.run(["fusermount3", "-u", str(mnt)], check=False)
            return f"[{name}] mounted"
        if rc == 0 or len(lines) != 1 or not lines[0].startswith("refmount: error:"):
            return f"[{name}] exit {rc}, stderr {stderr!r}"
        if maxrss_kb >= 512 * 1024:
            return f"[{name}] the CLI peaked at {maxrss_kb // 1024} MiB; error: {lines[0]}"
        return None

    with ThreadPoolExecutor(4) as ex:
        problems = [p for p in ex.map(one, cases) if p]
    assert not problems, "\n".join(problems)


def test_memory_cap_stops_what_the_size_checks_do_not_foresee(tmp_path, monkeypatch):
    """``str()`` of a list holding a 1 MB string a million times passes every size check
    (the list has a million items) and is one C call that builds a terabyte. The memory cap
    around rendering (lowered here to 256 MiB) stops it with MemoryError, well before the
    2 s watchdog; the process's own limit is restored afterwards. The watchdog's limit is raised
    here, so that on a loaded machine the clock does not decide what the memory cap is tested for."""
    import resource

    from refmount.refs import ReferenceSetError, build_index, sandbox, v1templates

    monkeypatch.setattr(sandbox, "RENDER_MEMORY", 256 << 20, raising=False)
    monkeypatch.setattr(v1templates, "RENDER_SECONDS", 300.0)
    before = resource.getrlimit(resource.RLIMIT_DATA)
    src = write(tmp_path / "repr-bomb.json", {"version": 1, "refs": {"k": [
        "/dev/null{% set l = ['a' * 1000000] * 1000000 %}{{ l|length }}{{ l }}", 0, 1]}})
    with pytest.raises(ReferenceSetError, match="template refused: it needs more than"):
        build_index(str(src), {})
    assert resource.getrlimit(resource.RLIMIT_DATA) == before


def test_legitimate_template_operations_still_work(mount, tmp_path):
    """The size checks leave ordinary formatting, joining and arithmetic alone: each URL
    renders to the name of a file that holds its own name."""
    tpl = {
        "a": "{{ '%05d' % n }}-{{ '{:06.2f}'.format(3.14159) }}-{{ ['x', 'y']|join('+') }}",
        "b": "{{ 'p' ~ n ~ 'q' }}{{ 'r' + 's' }}{{ 2 ** 10 + n * 3 }}{{ 'a.b'|replace('.', '_') }}",
        "c": "{{ '%s'|format('t') }}{{ 'u'.center(3) }}{{ ('v' * 3).replace('v', 'w') }}",
    }
    expected = {"a": "00042-003.14-x+y", "b": "p42qrs1150a_b", "c": "t u www"}
    for name in expected.values():
        (tmp_path / name).write_text(name)
    doc = {"version": 1, "templates": {f"f{k}": t for k, t in tpl.items()},
           "refs": {f"k/{k}": [f"{tmp_path}/{{{{ f{k}(n=42) }}}}"] for k in tpl}}
    m = mount(write(tmp_path / "ok.json", doc), "no_disk_cache")
    for k, name in expected.items():
        assert (m / "k" / k).read_text() == name


# --- unknown URL protocols -----------------------------------------------------------------------


def test_unknown_url_protocols_are_refused_at_mount(mount_fails, tmp_path):
    values = {
        "unknown-scheme": ["nosuchproto://host/x", 0, 10],
        "unknown-whole": ["gopher2://host/x"],
        "unknown-in-chain": ["zzz::/tmp/x", 0, 1],
        "scheme-with-plus": ["abc+def://x/y", 0, 1],
    }
    cases = v0_cases(tmp_path, values, mention=("bad/key", "protocol"))
    cases["templated-scheme"] = (write(tmp_path / "tplproto.json", {
        "version": 1, "templates": {"p": "nosuch"}, "refs": {"k": ["{{p}}://h/x", 0, 1]}}), (),
        ("protocol",))
    cases["remote_protocol-option"] = (write(tmp_path / "relproto.json", {"k": ["h/x", 0, 1]}),
                                       ("remote_protocol=nosuchproto",), ("protocol",))
    expect_errors(mount_fails, cases)


# --- Parquet record files with missing columns or wrong types -------------------------------------

ZARRAY = {"zarr_format": 2, "shape": [2], "chunks": [1], "dtype": "|u1", "compressor": None,
          "filters": None, "fill_value": 0, "order": "C"}


@pytest.fixture
def hostile_parquet(tmp_path) -> tuple[Path, dict[str, bytes], list[str]]:
    """Array ``bad`` (record_size 2) with one broken record file per way of breaking it, and a
    good record; array ``good`` intact. Returns (root, good chunks -> bytes, bad chunk keys)."""
    root = tmp_path / "hostile.parquet"
    target = write(root / "target.bin", bytes(range(256)))
    s = pa.string()
    records = {
        "good": pa.table({"path": pa.array([str(target), None], s),
                          "offset": pa.array([10, 0], pa.int64()),
                          "size": pa.array([3, 0], pa.int64()),
                          "raw": pa.array([None, b"raw!"], pa.binary())}),
        "no-size": pa.table({"path": pa.array([str(target)] * 2, s),
                             "offset": pa.array([1, 2], pa.int64()),
                             "raw": pa.array([None, None], pa.binary())}),
        "no-offset": pa.table({"path": pa.array([str(target)] * 2, s),
                               "size": pa.array([1, 2], pa.int64()),
                               "raw": pa.array([None, None], pa.binary())}),
        "no-path-no-raw": pa.table({"offset": pa.array([1, 2], pa.int64()),
                                    "size": pa.array([1, 2], pa.int64())}),
        "offset-strings": pa.table({"path": pa.array([str(target)] * 2, s),
                                    "offset": pa.array(["1", "2"], s),
                                    "size": pa.array([1, 2], pa.int64()),
                                    "raw": pa.array([None, None], pa.binary())}),
        "size-floats": pa.table({"path": pa.array([str(target)] * 2, s),
                                 "offset": pa.array([1, 2], pa.int64()),
                                 "size": pa.array([1.5, 2.0], pa.float64()),
                                 "raw": pa.array([None, None], pa.binary())}),
        "path-integers": pa.table({"path": pa.array([1, 2], pa.int64()),
                                   "offset": pa.array([1, 2], pa.int64()),
                                   "size": pa.array([1, 2], pa.int64()),
                                   "raw": pa.array([None, None], pa.binary())}),
        "raw-integers": pa.table({"path": pa.array([None, None], s),
                                  "offset": pa.array([0, 0], pa.int64()),
                                  "size": pa.array([0, 0], pa.int64()),
                                  "raw": pa.array([5, 6], pa.int64())}),
        "negative-offset": pa.table({"path": pa.array([str(target)] * 2, s),
                                     "offset": pa.array([-5, 2], pa.int64()),
                                     "size": pa.array([1, 2], pa.int64()),
                                     "raw": pa.array([None, None], pa.binary())}),
        "not-parquet": b"PAR1 but not really a parquet file\n" * 20,
        "empty-file": b"",
    }
    n = len(records)
    meta = {".zgroup": {"zarr_format": 2}, "bad/.zarray": {**ZARRAY, "shape": [2 * n]},
            "good/.zarray": ZARRAY}
    write(root / ".zmetadata", {"metadata": meta, "record_size": 2})
    (root / "bad").mkdir()
    bad_keys = []
    for i, (name, rec) in enumerate(records.items()):
        path = root / "bad" / f"refs.{i}.parq"
        if isinstance(rec, bytes):
            path.write_bytes(rec)
        else:
            pq.write_table(rec, path)
        if name != "good":
            bad_keys += [f"bad/{2 * i}", f"bad/{2 * i + 1}"]
    (root / "good").mkdir()
    pq.write_table(records["good"], root / "good" / "refs.0.parq")
    good = {"bad/0": bytes([10, 11, 12]), "bad/1": b"raw!",
            "good/0": bytes([10, 11, 12]), "good/1": b"raw!"}
    return root, good, bad_keys


def test_parquet_record_files_with_missing_columns_or_wrong_types(hostile_parquet, mount):
    root, good, bad_keys = hostile_parquet
    m = mount(root, "no_disk_cache")  # lazy: nothing of the record files is read to mount
    assert sorted(os.listdir(m)) == [".zgroup", ".zmetadata", "bad", "good"]
    problems = []
    for key in bad_keys:
        try:
            data = (m / key).read_bytes()
            problems.append(f"{key}: read {len(data)} bytes {data[:16]!r}, expected EIO")
        except OSError as e:
            if e.errno != errno.EIO:
                problems.append(f"{key}: {e}")
    assert not problems, "\n".join(problems)
    for key, data in good.items():
        assert (m / key).read_bytes() == data, key
    assert sorted(os.listdir(m / "good")) == [".zarray", "0", "1"]
    # the errors are not cached as files, and nothing else was disturbed
    for key in bad_keys[:4]:
        with pytest.raises(OSError) as info:
            (m / key).read_bytes()
        assert info.value.errno == errno.EIO
    m.refresh_procs()
    assert m.procs and all(p.is_running() for p in m.procs)
    assert is_mounted(m.path)
    assert json.loads((m / "bad/.zarray").read_bytes())["shape"][0] == 2 * (len(bad_keys) // 2 + 1)
