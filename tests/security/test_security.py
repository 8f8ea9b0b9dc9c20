"""Shared mounts do not leak (docs/security.md): each defence tested the way an attacker would
try it — a root ``allow_other`` mount, the unprivileged user ``nobody``, a 0600 secret file.

* a target flipped between the attacker's own file and a symlink to the secret while it is
  read (bounded race): zero secret bytes;
* FIFOs, devices and directories as targets fail at once and block no worker;
* the disk cache and logs are private to the mounting user, and a forbidden target is never
  served from a disk cache filled by a mount that was allowed to read it;
* a cache directory another user prepared (a real second user: world-writable, index/ and
  blocks/00..ff, symlinks planted) is refused at mount and nothing in it is written or
  followed; mounts whose environment points the same S3 URL at different endpoints never
  share blocks;
* an endless HTTP 206 body is cut off after the range (bounded memory);
* relative ``file://`` and ``~`` URLs resolve the same in the CLI and the daemon, and mounts
  sharing a cache never serve each other's bytes for them;
* credentials shaped to slip past naive redaction stay out of xattrs, logs and ``inspect``;
  a refused mount leaves no temporary index behind.
"""

from __future__ import annotations

import json
import os
import stat
import textwrap
import time
from pathlib import Path

import pytest
import trio
from support.confinement import as_nobody, as_user, mkdir_public, other_user, parquet_set, write_json
from support.mounts import is_mounted, run_cli
from support.probes import stats
from support.servers import moto_s3

from refmount.base.confinedopen import NotARegularFile, open_checked
from refmount.base.errors import FetchError
from refmount.base.redact import redact_url
from refmount.base.stats import Stats
from refmount.cache.blocks import DiskCache, MemoryLRU, aligned_buffer, round_up
from refmount.core.reader import RefReader
from refmount.refs import Ref, RefKind
from refmount.targets.fetch import Fetcher
from refmount.targets.localfile import read_range
from refmount.targets.policy import TargetPolicy

pytestmark = pytest.mark.timeout(360)
fuse = pytest.mark.fuse

SECRET = b"TOPSECRET!" * 1000
SYSTEM_PYTHON = "/usr/bin/python3"  # nobody cannot enter the build's virtual environment


@pytest.fixture
def secret(tmp_path) -> Path:
    """A 0600 root file in a 0700 directory outside the mounts' allowed directories: nobody
    cannot read it directly."""
    vault = tmp_path / "vault"
    vault.mkdir(mode=0o700)
    path = vault / "secret.bin"
    path.write_bytes(SECRET)
    path.chmod(0o600)
    assert as_nobody("cat", str(path)).returncode != 0, "nobody reads the secret directly"
    return path


def private_modes(root: Path) -> list[str]:
    """Paths under ``root`` (itself included) that group or others may use."""
    bad = []
    for p in [root, *root.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        if mode & 0o077:
            bad.append(f"{p}: {mode:o}")
    return bad


# --- 1. local reads open what was checked ---------------------------------------------------------

RACE_SCRIPT = """
import json, os, sys, threading, time
drop, mnt, secret, n, seconds = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
flip = os.path.join(drop, "flip")
stop = threading.Event()
flips = [0]

def flipper():
    own, link = os.path.join(drop, ".own"), os.path.join(drop, ".link")
    while not stop.is_set():
        with open(own, "wb") as f:
            f.write(b"a" * (n + 64))
        os.replace(own, flip)
        try:
            os.unlink(link)
        except FileNotFoundError:
            pass
        os.symlink(secret, link)
        os.replace(link, flip)
        flips[0] += 1

counts = {"ok": 0, "error": 0, "secret_bytes": 0, "reads": 0}
lock = threading.Lock()
keys = iter(range(n))
deadline = time.monotonic() + seconds

def reader():
    while time.monotonic() < deadline:
        with lock:
            i = next(keys, None)
        if i is None:
            return
        try:
            with open(os.path.join(mnt, "k", str(i)), "rb") as f:
                data = f.read()
            bad = sum(1 for b in data if b != ord("a"))
            with lock:
                counts["ok"] += 1
                counts["secret_bytes"] += bad
        except OSError:
            with lock:
                counts["error"] += 1
        with lock:
            counts["reads"] += 1

t = threading.Thread(target=flipper)
t.start()
readers = [threading.Thread(target=reader) for _ in range(4)]
for r in readers:
    r.start()
for r in readers:
    r.join()
stop.set()
t.join()
counts["flips"] = flips[0]
print(json.dumps(counts))
"""


@fuse
def test_symlink_flip_race_reads_no_secret_bytes(mount, public, secret):
    """nobody can create files in a directory the shared mount may read (here, a world-writable
    one in SOURCE's directory), and flips a target between a file of their own and a symlink to
    the secret while reading it through the mount, for a bounded time: some reads succeed (the
    own file), some fail (the symlink), and not one byte of the secret is ever returned."""
    n = 3000
    set_dir = mkdir_public(public / "set")
    drop = set_dir / "drop"
    drop.mkdir()
    drop.chmod(0o777)
    (drop / "flip").write_bytes(b"a" * (n + 64))
    src = write_json(set_dir / "refs.json", {f"k/{i}": [str(drop / "flip"), i, 32] for i in range(n)})
    m = mount(src, "allow_other", mnt=mkdir_public(public / "mnt"))
    r = as_nobody(SYSTEM_PYTHON, "-c", RACE_SCRIPT, str(drop), str(m.path), str(secret), str(n), "8")
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    counts = json.loads(r.stdout)
    print(f"symlink flip race as nobody: {counts}")
    assert counts["secret_bytes"] == 0, f"nobody read secret bytes through the mount: {counts}"
    assert counts["ok"] > 0 and counts["error"] > 0 and counts["flips"] > 10, (
        f"the race was not exercised: {counts}")


def test_open_checked_refuses_symlinks_and_special_files(tmp_path):
    """The safe open itself (targets/localfile.py), without a mount: a symlink anywhere beneath the
    allowed directory, FIFOs, directories and devices are refused without blocking; a regular
    file is read from the descriptor that was checked."""
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (root / "sub" / "f.bin").write_bytes(b"0123456789")
    (tmp_path / "outside.bin").write_bytes(b"outside")
    os.symlink(tmp_path / "outside.bin", root / "link")
    os.symlink(tmp_path, root / "dirlink")
    os.mkfifo(root / "fifo")
    roots = [str(root)]
    assert read_range(str(root / "sub" / "f.bin"), 2, 6, roots) == b"2345"
    assert read_range(str(root / "sub" / "f.bin"), 8, 100, roots) == b"89"
    for name in ("link", "dirlink/outside.bin"):
        with pytest.raises(PermissionError):
            open_checked(str(root / name), roots)
    with pytest.raises(NotARegularFile):
        open_checked(str(root / "fifo"), roots)  # returns at once: no writer needed
    with pytest.raises(NotARegularFile):
        open_checked(str(root / "fifo"), None)  # unconfined: still never opened for reading
    with pytest.raises(IsADirectoryError):
        open_checked(str(root / "sub"), roots)
    with pytest.raises(NotARegularFile):
        open_checked("/dev/zero", None)
    # Unconfined (a private mount), symlinks are followed.
    assert read_range(str(root / "link"), 0, 3, None) == b"out"


@fuse
def test_fifo_device_and_directory_targets_fail_at_once_and_block_nothing(mount, public):
    """Many reads of range references to a FIFO (more than the local worker threads), a
    device and a directory, as nobody: each gives EIO, and the mount still reads its files."""
    set_dir = mkdir_public(public / "set")
    os.mkfifo(set_dir / "fifo")
    (set_dir / "dir").mkdir()
    (set_dir / "data.bin").write_bytes(b"0123456789")
    refs = {f"fifo/{i}": [str(set_dir / "fifo"), i, 8] for i in range(48)}
    refs.update({"fifo-whole": [str(set_dir / "fifo")], "dir": [str(set_dir / "dir"), 0, 8],
                 "ok": [str(set_dir / "data.bin"), 2, 4]})
    try:
        os.mknod(set_dir / "null", 0o666 | stat.S_IFCHR, os.makedev(1, 3))
        refs["device"] = [str(set_dir / "null"), 0, 8]
    except OSError:
        pass  # no mknod here (a container): FIFOs and directories are still tested
    src = write_json(set_dir / "refs.json", refs)
    m = mount(src, "allow_other", "no_disk_cache", "timeout=5", mnt=mkdir_public(public / "mnt"))
    names = [k for k in refs if k != "ok"]
    r = as_nobody(SYSTEM_PYTHON, "-c", textwrap.dedent("""
        import json, os, sys
        from concurrent.futures import ThreadPoolExecutor
        def one(path):
            try:
                with open(path, "rb") as f:
                    return len(f.read())
            except OSError as e:
                return e.errno
        with ThreadPoolExecutor(len(sys.argv) - 1) as ex:
            print(json.dumps(list(ex.map(one, sys.argv[1:]))))
        """), *(str(m / k) for k in names))
    assert r.returncode == 0, r.stderr
    got = dict(zip(names, json.loads(r.stdout), strict=True))
    assert all(v == 5 for v in got.values()), f"expected EIO (5) for every special target: {got}"
    ok = as_nobody("cat", str(m / "ok"))
    assert ok.returncode == 0 and ok.stdout == b"2345", (ok, m.log_text(20))
    log = m.log.read_text(errors="replace")
    assert "a FIFO, not a regular file" in log


# --- 2. the cache never widens access -------------------------------------------------------------


@fuse
def test_cache_and_logs_are_private_whatever_the_umask(mount, public):
    """A root allow_other mount made under umask 000, its cache in a directory everyone may
    enter, with a block and an index directory and a log file an older version made 0755 and
    0644; nobody reads through the mount.
    Afterwards every directory and file of the block cache and the index, and the log file,
    are the mounting user's only, and nobody can read any of the cached files."""
    set_dir = mkdir_public(public / "set")
    data = os.urandom(3 * 2**20)
    (set_dir / "data.bin").write_bytes(data)
    src = write_json(set_dir / "refs.json", {"a": [str(set_dir / "data.bin"), 0, 2**20],
                                             "b": [str(set_dir / "data.bin")]})
    cache = mkdir_public(public / "cache")
    old_dir = cache / "blocks" / "00"
    old_dir.mkdir(parents=True)
    (cache / "blocks").chmod(0o755)
    old_dir.chmod(0o755)
    (cache / "index").mkdir(mode=0o755)
    (cache / "index").chmod(0o755)
    mnt = mkdir_public(public / "mnt")
    old_log = mount.base / f"{mnt.name}.log"  # the log file the mount fixture names
    old_log.write_text("an older mount's line\n")
    old_log.chmod(0o644)
    old = os.umask(0)
    try:
        m = mount(src, "allow_other", f"cache_dir={cache}", mnt=mnt)
    finally:
        os.umask(old)
    for key in ("a", "b"):
        assert as_nobody("cat", str(m / key)).returncode == 0
    m.cleanup()  # the cache writer finishes its blocks on unmount
    files = [p for p in cache.rglob("*") if p.is_file()]
    assert any("blocks" in p.parts for p in files) and list((cache / "index").glob("*.arrow")), (
        "nothing was cached: test is void")
    assert m.log == old_log
    bad = private_modes(cache / "blocks") + private_modes(cache / "index") + private_modes(m.log)
    assert not bad, "usable by others:\n" + "\n".join(bad)
    r = as_nobody("cat", *map(str, files))
    assert data[:4096] not in r.stdout and r.stdout == b"", f"nobody read {len(r.stdout)} bytes"


@pytest.mark.parametrize("mode", ["detached", "foreground"])
@fuse
def test_cache_dir_another_user_prepared_is_refused(public, secret, mode):
    """User B, a real second user, prepares the cache directory a root mount will use, in a
    shared sticky directory (as /tmp): index/ and blocks/00..ff, all mode 0777, and in every
    block directory a symlink to a root-only file at a name a writer could use. Root's mount
    is refused before anything starts, with one line naming the directory and what to do;
    nothing is mounted, root writes nothing there, and the root-only file is unchanged."""
    uid = other_user()
    shared = public / "shared"
    shared.mkdir()
    shared.chmod(0o1777)
    cache = shared / "cache"
    prepare = (f"mkdir -p {cache}/index && for i in $(seq 0 255); do "
               f"d={cache}/blocks/$(printf %02x $i); mkdir -p $d && ln -s {secret} $d/planted.tmp; "
               f"done && chmod -R 0777 {cache}")
    r = as_user(uid, "sh", "-c", prepare)
    assert r.returncode == 0 and (cache / "blocks" / "ff" / "planted.tmp").is_symlink(), r.stderr
    set_dir = mkdir_public(public / "set")
    (set_dir / "data.bin").write_bytes(b"d" * 70000)
    src = write_json(set_dir / "refs.json", {"a": [str(set_dir / "data.bin"), 0, 70000]})
    mnt = mkdir_public(public / "mnt")
    extra = ["-f"] if mode == "foreground" else []
    r = run_cli(str(src), str(mnt), "-o", f"cache_dir={cache}", *extra)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and len(lines) == 1, r.stderr
    assert lines[0].startswith(f"refmount: error: cache directory {cache} is owned by uid {uid}")
    assert "choose another cache_dir" in lines[0], lines[0]
    assert not is_mounted(mnt)
    assert secret.read_bytes() == SECRET
    ours = [str(p) for p in [cache, *cache.rglob("*")] if p.lstat().st_uid != uid]
    assert not ours, f"root wrote in B's directory: {ours[:5]}"


@fuse
def test_s3_endpoints_from_the_environment_share_no_blocks(mount, tmp_path, monkeypatch):
    """Two moto S3 servers hold different bytes under the same s3://bkt/obj. Mounts with the
    same options and cache_dir, the endpoint given by AWS_ENDPOINT_URL, each read their own
    server's bytes; a later mount of the first endpoint is served from the disk cache (the
    cache is shared where it should be)."""
    one, two = os.urandom(50000), os.urandom(50000)
    src = write_json(tmp_path / "refs.json", {"k": ["s3://bkt/obj", 0, 50000]})
    options = json.dumps({"key": "test", "secret": "test",
                          "client_kwargs": {"region_name": "eu-west-1"}})
    with moto_s3({"bkt/obj": one}) as first, moto_s3({"bkt/obj": two}) as second:
        got = []
        for endpoint in (first, second, first):
            monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
            m = mount(src, f"remote_options={options}")
            got.append(((m / "k").read_bytes(), stats(m)["disk_hits"]))
            m.cleanup()  # the cache writer finishes its blocks on unmount
    assert [data == want for (data, _), want in zip(got, (one, two, one), strict=True)] == [True] * 3
    assert [hits for _, hits in got] == [0, 0, 1], got


@fuse
def test_forbidden_parquet_target_is_never_served_from_the_disk_cache(mount, public, secret):
    """A private mount reads the secret (root may) and caches it; a shared mount with the same
    cache_dir whose Parquet row names the secret gives EIO — as without a disk cache — and
    nobody gets no byte of it."""
    cache = public / "cache"
    private = public / "private.parquet"
    private.mkdir()
    parquet_set(private, [(str(secret), 0, 64, None)])
    p = mount(private, f"cache_dir={cache}")
    assert (p / "v/0").read_bytes() == SECRET[:64]
    p.cleanup()
    assert any(f.is_file() for f in (cache / "blocks").rglob("*")), "not cached: test is void"

    shared = mkdir_public(public / "shared.parquet")
    (shared / "inside.bin").write_bytes(b"inside")
    parquet_set(shared, [(str(secret), 0, 64, None), (str(shared / "inside.bin"), 0, 6, None)])
    s = mount(shared, "allow_other", f"cache_dir={cache}", mnt=mkdir_public(public / "mnt"))
    r = as_nobody("cat", str(s / "v/0"))
    assert b"SECRET" not in r.stdout and r.returncode != 0, f"nobody read {r.stdout[:40]!r}"
    assert b"Input/output error" in r.stderr
    assert as_nobody("cat", str(s / "v/1")).stdout == b"inside"


def test_read_time_policy_comes_before_the_disk_cache(tmp_path):
    """Without a mount: a block of a forbidden target that is in the disk cache under the very
    key this reader would use is not served; the read fails with the policy's reason."""
    allowed, vault = tmp_path / "allowed", tmp_path / "vault"
    allowed.mkdir()
    vault.mkdir()
    (vault / "secret.bin").write_bytes(SECRET)
    policy = TargetPolicy([str(allowed)], str(allowed), None)
    disk = DiskCache(str(tmp_path / "cache"), 2**30, direct_io=False, target_key=policy.cache_identity)
    url = str(vault / "secret.bin")
    buf = aligned_buffer(round_up(64, 4096))
    buf[:64] = SECRET[:64]
    buf[64:] = bytes(len(buf) - 64)
    disk.put_digest(disk.key_digest(url, 0, 64), 64, buf)
    assert disk.get(url, 0, 64) == SECRET[:64]  # it is there, under the reader's key
    stats = Stats()
    fetcher = Fetcher({}, policy, timeout=5, retries=0, max_connections=4, stats=stats)
    reader = RefReader(fetcher, MemoryLRU(2**20), disk, whole_fetch_limit=2**20,
                       block_size=2**20, max_readahead=0, stats=stats)

    async def main() -> object:
        try:
            return await reader.read(Ref(RefKind.RANGE, url, 0, 64), 0, 64)
        except FetchError as e:
            return e

    got = trio.run(main)
    assert isinstance(got, FetchError) and "outside the allowed directories" in str(got), got


def test_cache_identity_is_the_resolved_path_and_the_confinement(tmp_path, monkeypatch):
    """Without a mount: ``file://relative`` and bare relative paths resolve against SOURCE's
    directory whatever the working directory, ``~`` against the home directory when the policy
    was made; the identity of a local target in the disk cache is that absolute path, plus the
    allowed directories of a confined mount."""
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    monkeypatch.setenv("HOME", str(a))
    pa = TargetPolicy(["/"], str(a), None)
    monkeypatch.setenv("HOME", str(b))
    pb = TargetPolicy(["/"], str(b), None)
    for cwd in (a, b, Path("/")):
        monkeypatch.chdir(cwd)
        assert pa.full_url("file://data.bin") == f"file://{a}/data.bin"
        assert pa.full_url("data.bin") == f"{a}/data.bin"
        assert pb.full_url("file://x/../data.bin") == f"file://{b}/data.bin"
        assert pa.full_url("file://~/h.bin") == f"file://{a}/h.bin"
        assert pb.full_url("~/h.bin") == f"{b}/h.bin"
        assert pa.cache_identity("file://~/h.bin") != pb.cache_identity("file://~/h.bin")
    assert pa.full_url("https://h/x.bin") == "https://h/x.bin"
    remote = TargetPolicy(["/"], None, None)
    assert "relative local path" in (remote.problem("file://data.bin", resolve=False) or "")
    confined = TargetPolicy([str(a)], str(a), None)
    url = str(a / "data.bin")
    assert confined.cache_identity(url) != pa.cache_identity(url)  # never each other's blocks
    assert pa.cache_identity(url) == pa.full_url(url)  # private mounts keep their keys


# --- 3. response bodies are bounded ---------------------------------------------------------------


@fuse
def test_endless_http_body_is_cut_off(mount, public, srv):
    """A 206 with the right Content-Range and a body that never ends: nobody's read gives EIO,
    each response is abandoned after the range, and the daemon's memory stays small."""
    srv.put("big.bin", os.urandom(2**20))
    srv.add_fault("/big.bin", "endless", times=None, seconds=30)
    set_dir = mkdir_public(public / "set")
    url = srv.url_for("big.bin")
    # e, w: ranges inside the target; p: a range running past its end (the answer's
    # Content-Range says where the target ends); whole: the whole target.
    src = write_json(set_dir / "refs.json", {"e": [url, 0, 65536], "w": [url, 2**19, 2**19],
                                             "p": [url, 2**20 - 4096, 65536], "whole": [url],
                                             "ok": "inline"})
    m = mount(src, "allow_other", "no_disk_cache", "timeout=10", mnt=mkdir_public(public / "mnt"))
    t0 = time.monotonic()
    for key in ("e", "w", "p", "whole"):
        r = as_nobody("cat", str(m / key))
        assert r.returncode != 0 and b"Input/output error" in r.stderr, (key, r.stderr)
    took = time.monotonic() - t0
    rss = max(p.memory_info().rss for p in m.procs if p.is_running())
    sent = [q.sent for q in srv.log("/big.bin") if q.fault == "endless"]
    assert rss < 1 << 30, f"daemon RSS {rss >> 20} MiB after endless bodies"
    assert sent and max(sent) < 64 << 20, f"the daemon kept reading: {sent}"
    assert as_nobody("cat", str(m / "ok")).stdout == b"inline"
    print(f"4 keys over endless bodies: EIO after {took:.1f} s, {len(sent)} responses, "
          f"largest {max(sent) >> 10} KiB sent, daemon RSS {rss >> 20} MiB")


# --- 2. cache identity of relative and ~ URLs -----------------------------------------------------


@fuse
def test_relative_and_home_file_urls_resolve_alike_in_cli_and_daemon(mount, public, monkeypatch):
    """``file://data.bin`` is relative to SOURCE's directory (not to the working directory of
    the CLI, nor ``/`` where the detached daemon runs), and ``file://~/h.bin`` is under the
    mounting user's home; two mounts sharing a cache, started from the same directory with
    different HOMEs, each serve their own bytes."""
    cache = public / "cache"
    cwd = mkdir_public(public / "cwd")
    (cwd / "data.bin").write_bytes(b"C" * 64)  # what a cwd-relative reading would serve
    mounts = {}
    for name in ("A", "B"):
        d = mkdir_public(public / name)
        (d / "data.bin").write_bytes(name.encode() * 64)
        home = mkdir_public(d / "home")
        (home / "h.bin").write_bytes(name.lower().encode() * 64)
        src = write_json(d / "refs.json", {"rel": ["file://data.bin", 0, 16],
                                          "home": ["file://~/h.bin", 0, 16]})
        monkeypatch.setenv("HOME", str(home))
        m = mount.track(src, "allow_other", f"cache_dir={cache}", mnt=mkdir_public(public / f"m{name}"))
        r = run_cli(str(src), str(m.path), "-o", ",".join(m.opts), cwd=str(cwd))
        m.refresh_procs()
        assert r.returncode == 0, r.stderr + m.log_text(20)
        mounts[name] = m
    for name, m in mounts.items():
        for key, want in (("rel", name.encode() * 16), ("home", name.lower().encode() * 16)):
            got = as_nobody("cat", str(m / key))
            assert got.stdout == want, (name, key, got, m.log_text(20))


# --- 4. redaction and temporary files -------------------------------------------------------------

CRED_URLS = {
    "password with @": ("https://user:p@ss-SENT1@127.0.0.1:9/x.bin", "ss-SENT1"),
    "signature with :": ("https://127.0.0.1:9/x.bin?X-Amz-Signature=ab:SENT2&a=1", "SENT2"),
    "password=": ("https://127.0.0.1:9/x.bin?password=pa:SENT3", "SENT3"),
    "apikey=": ("https://127.0.0.1:9/x.bin?apikey=SENT4", "SENT4"),
    "api_key=": ("https://127.0.0.1:9/x.bin?n=1&api_key=SENT5", "SENT5"),
    "secret=": ("https://127.0.0.1:9/x.bin?secret=SENT6", "SENT6"),
    "auth=": ("https://127.0.0.1:9/x.bin?auth=SENT7", "SENT7"),
    "token=": ("https://127.0.0.1:9/x.bin?token=a/b=SENT8", "SENT8"),
    "sig=": ("https://127.0.0.1:9/x.bin?sig=SENT9", "SENT9"),
    "azure sas": ("https://127.0.0.1:9/x.bin?sv=2021&se=2030&sp=r&sig=SENT10%3D", "SENT10"),
}


@pytest.mark.parametrize("name", list(CRED_URLS))
def test_redact_url_covers_credential_shapes(name):
    url, sentinel = CRED_URLS[name]
    out = redact_url(f"read failed: {url!r}: error")
    assert sentinel not in out and "SENT" not in out, out
    assert "127.0.0.1:9/x.bin" in out  # the rest stays readable


@fuse
def test_credentials_stay_out_of_xattrs_logs_and_inspect(mount, public, srv):
    """Targets and SOURCE with credentials shaped as above: nobody's xattrs, the daemon's log
    (the reads fail, so the URLs are logged) and ``refmount inspect`` show none of them."""
    set_dir = mkdir_public(public / "set")
    refs = {f"t/{i}": [url, 0, 4] for i, (url, _) in enumerate(CRED_URLS.values())}
    src = write_json(set_dir / "refs.json", refs)
    m = mount(src, "allow_other", "no_disk_cache", "timeout=2", "retries=0",
              mnt=mkdir_public(public / "mnt"))
    shown = []
    for i in range(len(CRED_URLS)):
        r = as_nobody("getfattr", "-n", "user.refmount.url", "--only-values", str(m / f"t/{i}"))
        assert r.returncode == 0, r.stderr
        shown.append(r.stdout.decode(errors="replace"))
        as_nobody("cat", str(m / f"t/{i}"))  # fails: logged with its URL
    srv.put("refs.json", src.read_bytes())
    inspected = run_cli("inspect", srv.url_for("refs.json", userinfo="user:pa:SENT11"))
    assert inspected.returncode == 0 and "***@127.0.0.1" in inspected.stdout, inspected
    m.cleanup()
    text = "\n".join(shown) + m.log.read_text(errors="replace") + inspected.stdout + inspected.stderr
    leaked = [s for _, s in [*CRED_URLS.values(), ("", "SENT11")] if s in text]
    assert not leaked, f"leaked: {leaked}"
    assert "read failed" in m.log.read_text(errors="replace"), "no read was logged: test is void"


@pytest.mark.parametrize("mode", ["detached", "foreground"])
@fuse
def test_refused_mount_leaves_no_temporary_index(public, tmp_path, monkeypatch, mode):
    """A set refused by the target check after it was indexed (no_disk_cache: the index is a
    temporary file) leaves no ``refmount-index-*.arrow`` behind."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    set_dir = mkdir_public(public / "set")
    src = write_json(set_dir / "refs.json", {"a": "inline", "b": ["/etc/hostname", 0, 4]})
    mnt = mkdir_public(public / "mnt")
    extra = ["-f"] if mode == "foreground" else []
    r = run_cli(str(src), str(mnt), "-o", "allow_other,no_disk_cache", *extra)
    assert r.returncode == 1 and "outside the allowed directories" in r.stderr, r.stderr
    assert not list(runtime.iterdir()), f"left behind: {list(runtime.iterdir())}"

