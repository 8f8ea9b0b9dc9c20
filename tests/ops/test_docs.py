"""The command lines of README.md and docs/operations.md run as written.

Every line of their ``sh`` blocks, and every ``python`` block, is either run here — with the
documented placeholders (``refs.json``, ``/mnt/data``, ``/srv/refs/...``) standing for a real
reference set and mountpoints under a temporary directory, and ``s3://bucket`` for moto's S3
server — or listed in ``ELSEWHERE`` with the test that runs it or why it cannot run on a test
machine. A new command line in either document fails this test until it is one or the other.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.mounts import REPO, cli_env, fusermount_u, is_mounted
from support.servers import moto_s3

pytestmark = [pytest.mark.fuse, pytest.mark.long(50), pytest.mark.timeout(400)]

DOCS = ("README.md", "docs/operations.md")

# Lines not run here: the start of the line -> who runs it, or why it cannot run here.
ELSEWHERE = {
    "kubectl apply": "needs a Kubernetes cluster (tests/scale/test_scaleout.py checks the manifests and runs "
                     "their nginx configuration)",
    "bash scripts/demo.sh": "the demo: scripts/demo.sh is the README's first command, run by hand",
    "bash scripts/test.sh": "this suite itself (.ci/run runs it)",
    "sudo bash scripts/install.sh": "tests/ops/test_systemd.py and tests/ops/test_admin.py (system install)",
    "mount -t fuse.refmount": "tests/ops/test_admin.py::test_mount_t_fuse_refmount_through_mount_fuse3 "
                              "(needs the system install)",
    "systemctl": "needs systemd as PID 1 (the units: tests/ops/test_systemd.py)",
    "journalctl": "needs systemd's journal (the units: tests/ops/test_systemd.py)",
    "cp systemd/": "installs into /etc/systemd (tests/ops/test_systemd.py checks the files)",
    "cat > /etc/refmount/": "writes /etc/refmount (tests/ops/test_systemd.py runs the unit's commands)",
    "REFMOUNT_": "inside the heredoc above",
    "EOF": "the heredoc's end",
    "mkdir -p /mnt/data": "the mountpoint of the systemd example (tests/ops/test_systemd.py)",
}


def documented_lines() -> list[tuple[str, str]]:
    """(document, line) for every command line of the sh blocks."""
    out = []
    for doc in DOCS:
        text = (REPO / doc).read_text()
        for block in re.findall(r"```sh\n(.*?)```", text, re.S):
            for raw in block.splitlines():
                line = raw.split("  #")[0].rstrip() if not raw.lstrip().startswith("#") else ""
                if line.strip():
                    out.append((doc, line.strip()))
    return out


def python_blocks() -> list[tuple[str, str]]:
    return [(doc, b) for doc in DOCS
            for b in re.findall(r"```python\n(.*?)```", (REPO / doc).read_text(), re.S)]


class Place:
    """A temporary stand-in for the paths the documents use."""

    def __init__(self, base: Path, datasets) -> None:
        self.base = base
        self.work = base / "work"  # the current directory: refs.json, refs-v1.json
        self.work.mkdir()
        # The set's targets live in /data/netcdf, away from the set (as allow_local shows).
        data = base / "data/netcdf"
        data.mkdir(parents=True)
        refs = datasets.load("nc4_local")
        for key, value in refs.items():
            if isinstance(value, list):
                target = data / Path(value[0]).name
                if not target.exists():
                    shutil.copy(value[0], target)
                refs[key] = [str(target), *value[1:]]
        text = json.dumps(refs)
        (self.work / "refs.json").write_text(text)
        (self.work / "refs-v1.json").write_text(json.dumps(
            {"version": 1, "templates": {"u": str(datasets.blob)},
             "gen": [{"key": "k/{{i}}", "url": "{{u}}", "offset": "{{i * 10}}", "length": "10",
                      "dimensions": {"i": {"stop": 5}}}],
             "refs": {".zgroup": '{"zarr_format": 2}'}}))
        from support.icechunk_data import build_repository  # an Icechunk repository (tag v1)

        build_repository(base / "srv/icechunk/era5", base / "srv/icechunk-files")
        srv = base / "srv/refs"
        srv.mkdir(parents=True)
        for name in ("data.json", "era5.json"):
            (srv / name).write_text(text)
        for mnt in ("mnt/data", "mnt/era5", "mnt/d", "mnt/s3", "mnt/refs"):
            (base / mnt).mkdir(parents=True)
        self.env = cli_env()
        self.env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{self.env['PATH']}"
        self.env["XDG_CACHE_HOME"] = str(base / "cache")
        self.servers: dict[str, int] = {}  # base URL -> PID of the servers the lines started

    def local(self, text: str) -> str:
        return re.sub(r"(?<![\w.])/(mnt|srv|data)/", lambda m: f"{self.base}/{m.group(1)}/", text)

    def run(self, line: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run(["bash", "-c", self.local(line)], cwd=self.work, env=self.env,
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)

    def mounts(self) -> list[Path]:
        return [p for p in (self.base / "mnt").iterdir() if is_mounted(p)]

    def started_server(self, r: subprocess.CompletedProcess) -> None:
        """A detached ``refmount serve`` printed ``URL PID``: stopped at the end."""
        url, pid = r.stdout.split()
        self.servers[url] = int(pid)

    def stop_servers(self) -> None:
        for pid in self.servers.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGTERM)
        for pid in self.servers.values():
            deadline = time.monotonic() + 20
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
        self.servers.clear()


@pytest.fixture
def place(tmp_path, datasets):
    p = Place(tmp_path, datasets)
    try:
        yield p
    finally:
        p.stop_servers()
        for m in p.mounts():
            fusermount_u(m)


def where(line: str) -> str | None:
    return next((why for start, why in ELSEWHERE.items() if line.startswith(start)), None)


def run_foreground(place: Place, line: str) -> None:
    """``refmount ... -f`` / ``-d``: it serves until stopped; it must answer, then SIGTERM."""
    proc = subprocess.Popen(["bash", "-c", "exec " + place.local(line)], cwd=place.work,
                            env=place.env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            text=True, stdin=subprocess.DEVNULL)
    mnt = Path(place.local(line.split()[2]))
    try:
        deadline = time.monotonic() + 60
        while not is_mounted(mnt):
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.1)
        assert os.listdir(mnt)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
    assert not is_mounted(mnt)


MOUNT_LINE = re.compile(r"^refmount (\S+) (/mnt/\S+)")


SERVER = "http://127.0.0.1:8080/"


def prepare(place: Place, line: str) -> None:
    """Each line runs as the document shows it in its place: a line that mounts finds its
    mountpoint free, one that starts a server finds its port free; any other line that names a
    mountpoint finds ``refs.json`` mounted there, and one that names the server's address
    finds ``refs.json`` served there (decoded)."""
    if line.startswith("refmount serve "):
        place.stop_servers()
        return
    if SERVER.rstrip("/") in line and not place.servers:
        r = place.run("refmount serve refs.json -o decode,allow_local=/data/netcdf")
        assert r.returncode == 0, r.stderr
        place.started_server(r)
    if (m := MOUNT_LINE.match(line)) is not None and m[1] not in ("stats", "inspect", "expand"):
        mnt = Path(place.local(m[2]))
        if is_mounted(mnt):
            fusermount_u(mnt)
        return
    for name in re.findall(r"/mnt/(\w+)", line):
        mnt = place.base / "mnt" / name
        if not is_mounted(mnt):
            r = place.run(f"refmount refs.json {mnt}")
            assert r.returncode == 0, r.stderr


def test_every_documented_command_line_runs(place):
    """Every line not run elsewhere runs here with exit status 0."""
    ran, failed = [], []
    with moto_s3({"bucket/refs.json": (place.work / "refs.json").read_bytes()},
                 public=True) as endpoint:
        place.env["AWS_ENDPOINT_URL"] = endpoint
        for doc, line in documented_lines():
            if where(line) is not None:
                continue
            prepare(place, line)
            ran.append(line)
            if re.search(r"\s-[fd](\s|$)", line):
                run_foreground(place, line)
                continue
            r = place.run(line)
            if r.returncode != 0:
                failed.append(f"{doc}: {line}\n  exit {r.returncode}: {r.stderr.strip()[-500:]}")
            elif line.startswith("refmount serve "):
                place.started_server(r)
    assert not failed, "\n".join(failed)
    assert len(ran) >= 15, ran
    place.stop_servers()
    with socket.socket() as c, pytest.raises(OSError):
        c.connect(("127.0.0.1", 8080))  # nothing left listening


def test_every_python_block_runs(place):
    for doc, block in python_blocks():
        r = subprocess.run([sys.executable, "-c", place.local(block)], cwd=place.work,
                           env=place.env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, f"{doc}:\n{block}\n{r.stderr[-1500:]}"
    assert not place.mounts()


def test_lines_not_run_here_say_where_they_are_run():
    """Every line skipped above matches an ELSEWHERE entry, and every entry is still used."""
    lines = [line for _, line in documented_lines()]
    used = {start for start in ELSEWHERE for line in lines if line.startswith(start)}
    assert used == set(ELSEWHERE), f"entries no document uses any more: {set(ELSEWHERE) - used}"
