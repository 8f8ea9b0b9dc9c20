"""Past one machine (docs/operations.md, "Many machines"): the nginx configuration of
docs/examples/nginx-refmount-cache.conf runs as it is -- only its ports, paths and the
replicas' addresses substituted -- in front of two ``refmount serve`` replicas on loopback:
the second read of a key is a cache hit that reaches no replica, ranges across the cache's
slices come back right, and the entity tag stays the replicas' strong one. The Kubernetes
manifests of docs/examples/ are read and checked for what the documentation says of them
(they need a cluster to run)."""

from __future__ import annotations

import http.client
import json
import re
from pathlib import Path

import numpy as np
import pytest
import yaml
from support.mounts import REPO
from support.servers import NginxConfigured

pytestmark = [pytest.mark.timeout(600)]

EXAMPLES = REPO / "docs" / "examples"
CONF = EXAMPLES / "nginx-refmount-cache.conf"
MiB = 2**20


def render(conf: str, *, port: int, run: Path, replicas: list[str], user: str) -> str:
    """The example with this machine's port, paths and replicas: every other line as written."""
    out = conf.replace("user www-data;", user)
    out = out.replace("/run/nginx-refmount.pid", str(run / "nginx.pid"))
    out = out.replace("/var/log/nginx/", f"{run}/")
    out = out.replace("/var/cache/nginx/", f"{run}/cache/")
    out = out.replace("listen 8080;", f"listen 127.0.0.1:{port};")
    servers = re.findall(r"^\s*server 10\.0\.0\.\d+:8080;.*$", out, flags=re.M)
    assert len(servers) == len(replicas), servers
    for line, replica in zip(servers, replicas, strict=True):
        out = out.replace(line, f"        server {replica};")
    for path in ("/run/", "/var/"):
        assert path not in out.replace(str(run), ""), f"a path of the example left: {path}"
    return out


def get(port: int, path: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        conn.request("GET", path, headers=headers or {})
        r = conn.getresponse()
        return r.status, {k.lower(): v for k, v in r.getheaders()}, r.read()
    finally:
        conn.close()


@pytest.fixture
def cached(serve, tmp_path):
    """Two serve replicas of a set with a 3.5 MiB whole-file key and a range key, behind the
    example's nginx; (nginx's port, the file's bytes, the replicas)."""
    data = np.random.default_rng(45).integers(0, 256, 7 * MiB // 2, dtype=np.uint8).tobytes()
    (tmp_path / "blob.bin").write_bytes(data)
    refs = {"big": [str(tmp_path / "blob.bin")], "part": [str(tmp_path / "blob.bin"), 1000, 2 * MiB]}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    replicas = [serve(tmp_path / "refs.json") for _ in range(2)]
    run = tmp_path / "nginx"
    (run / "cache").mkdir(parents=True)  # /var/cache/nginx, which the nginx package makes
    nginx = NginxConfigured(lambda port: render(CONF.read_text(), port=port, run=run,
                                                replicas=[f"{r.host}:{r.port}" for r in replicas],
                                                user=nginx.user_line()), run)
    nginx.start(timeout=30)
    try:
        assert nginx.port is not None
        yield nginx.port, data, replicas
    finally:
        nginx.stop()


def served(replicas) -> int:
    """GET requests the replicas answered, all statuses."""
    return sum(sum(r.stats()["http_status"].values()) for r in replicas)


def test_the_second_read_is_a_cache_hit(cached) -> None:
    port, data, replicas = cached
    status, h, body = get(port, "/big")
    assert (status, body == data) == (200, True)
    assert h["x-cache-status"] == "MISS"
    etag = h["etag"]
    assert not etag.startswith("W/"), etag  # a strong tag: what slice needs from the replicas
    before = served(replicas)
    status, h, body = get(port, "/big")
    assert (status, h["x-cache-status"], body == data) == (200, "HIT", True)
    assert h["etag"] == etag
    status, h, body = get(port, "/part")
    assert (status, body) == (200, data[1000:1000 + 2 * MiB])
    after = served(replicas)
    assert after - before == 2 + 2  # /part's two slices (and a stats request each); /big none


@pytest.mark.parametrize("header, lo, hi", [
    ("bytes=0-99", 0, 100),
    ("bytes=1048000-1049999", 1048000, 1050000),  # across two slices
    ("bytes=3145728-", 3145728, 7 * MiB // 2),  # the last slice, short
    ("bytes=-1000", 7 * MiB // 2 - 1000, 7 * MiB // 2),
])
def test_ranges_come_back_right_cold_and_cached(cached, header, lo, hi) -> None:
    port, data, _ = cached
    for attempt in ("cold", "cached"):
        status, h, body = get(port, "/big", {"Range": header})
        assert status == 206, (attempt, status, h)
        assert body == data[lo:hi], attempt
        assert h["content-range"] == f"bytes {lo}-{hi - 1}/{len(data)}", attempt
    assert h["x-cache-status"] == "HIT"


def test_a_range_past_the_end_is_refused(cached) -> None:
    port, data, _ = cached
    status, h, _ = get(port, "/big", {"Range": f"bytes={len(data) + 10}-"})
    assert status == 416, (status, h)


def test_the_kubernetes_manifests_say_what_the_documentation_does() -> None:
    docs = {(d["kind"], d["metadata"]["name"]): d
            for f in ("refmount-daemonset.yaml", "refmount-serve.yaml")
            for d in yaml.safe_load_all((EXAMPLES / f).read_text())}
    ds = docs[("DaemonSet", "refmount")]["spec"]["template"]["spec"]
    node = ds["containers"][0]
    mounts = {m["name"]: m for m in node["volumeMounts"]}
    volumes = {v["name"]: v for v in ds["volumes"]}
    assert node["securityContext"]["privileged"] is True
    assert mounts["mnt"]["mountPropagation"] == "Bidirectional"
    assert volumes["mnt"]["hostPath"]["path"] == "/mnt/refmount"
    assert volumes["fuse"]["hostPath"] == {"path": "/dev/fuse", "type": "CharDevice"}
    assert node["command"][:2] == ["refmount", "-f"]  # the mount serves in the container's process
    assert node["command"][3].startswith(mounts["mnt"]["mountPath"] + "/")
    reader = docs[("Pod", "reader")]["spec"]["containers"][0]["volumeMounts"][0]
    assert reader["mountPropagation"] == "HostToContainer" and reader["readOnly"] is True
    serve = docs[("Deployment", "refmount-serve")]["spec"]
    container = serve["template"]["spec"]["containers"][0]
    assert serve["replicas"] > 1
    assert container["command"][:2] == ["refmount", "serve"] and "-f" in container["command"]
    assert container["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert "privileged" not in container["securityContext"]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["path"] == "/.refmount/stats"
    cache = docs[("Deployment", "refmount-cache")]["spec"]["template"]["spec"]["containers"][0]
    conf = {"mountPath": "/etc/nginx/nginx.conf", "name": "conf", "subPath": "nginx.conf"}
    assert conf in cache["volumeMounts"]
    assert "listen 8080;" in CONF.read_text() and cache["ports"][0]["containerPort"] == 8080
