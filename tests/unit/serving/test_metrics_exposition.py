"""The metrics' collector (serving/metrics.py) over real counters, without FUSE or a server:
names and values, bounded labels, nothing of a URL, key or credential, promtool's check."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

from prometheus_client.parser import text_string_to_metric_families

from refmount.base.errors import FetchError
from refmount.base.latency import BUCKETS, Latency
from refmount.base.stats import PROTOCOLS, Stats, protocol_of
from refmount.cache.blocks import MemoryLRU
from refmount.serving.metrics import MetricsCollector, Reading, exposition

SECRET = "SENTINELsecret9f3a"  # in URLs' userinfo and query strings
KEY = "SENTINELkey41c7"  # in keys
SET = "SENTINELset77b2"  # in set names


def core(memory: int = 1 << 20) -> SimpleNamespace:
    return SimpleNamespace(stats=Stats(), reader=SimpleNamespace(
        memory=MemoryLRU(memory), target_readahead=SimpleNamespace(inflight_bytes=0)), disk=None)


def samples(text: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def value(text: bytes, name: str, **labels: str) -> float:
    return samples(text)[(name, tuple(sorted(labels.items())))]


def test_counters_are_read_from_stats_at_each_scrape():
    c = core()
    collector = MetricsCollector(lambda: Reading("fuse", cores=[c]))
    before = exposition(collector)
    assert value(before, "refmount_fuse_requests_total", kind="read") == 0
    assert value(before, "refmount_cache_misses_total") == 0
    s = c.stats
    s.reads += 3
    s.lookups += 2
    s.bytes_read += 12345
    s.misses += 1
    s.memory_hits += 2
    s.fetched("https://h.example/a.nc", 1000, 0.02)
    s.fetched("s3://bucket/b.nc", 500, 0.3)
    s.retried("s3://bucket/b.nc")
    s.request_latency.observe(0.0002)
    c.reader.memory.put("a", b"x" * 600_000)
    c.reader.memory.put("b", b"y" * 600_000)  # evicts a
    c.reader.target_readahead.inflight_bytes = 4096
    after = exposition(collector)
    assert value(after, "refmount_fuse_requests_total", kind="read") == 3
    assert value(after, "refmount_fuse_requests_total", kind="lookup") == 2
    assert value(after, "refmount_read_bytes_total") == 12345
    assert value(after, "refmount_cache_misses_total") == 1
    assert value(after, "refmount_cache_hits_total", cache="memory") == 2
    assert value(after, "refmount_cache_evictions_total", cache="memory") == 1
    assert value(after, "refmount_cache_bytes", cache="memory") == 600_000
    assert value(after, "refmount_inflight_bytes") == 4096
    assert value(after, "refmount_fetches_total", protocol="https") == 1
    assert value(after, "refmount_fetched_bytes_total", protocol="s3") == 500
    assert value(after, "refmount_fetch_retries_total", protocol="s3") == 1
    assert value(after, "refmount_fetch_duration_seconds_count") == 2
    assert value(after, "refmount_fetch_duration_seconds_bucket", le="0.025") == 1
    assert value(after, "refmount_fetch_duration_seconds_bucket", le="+Inf") == 2
    assert abs(value(after, "refmount_fetch_duration_seconds_sum") - 0.32) < 1e-9
    assert value(after, "refmount_request_duration_seconds_count", frontend="fuse") == 1
    # what `refmount stats` shows is unchanged: numbers and texts, no histograms
    shown = s.as_dict()
    assert "request_latency" not in shown and "protocols" not in shown
    json.dumps(shown)


def test_several_sets_and_http_counters_add_up():
    a, b = core(), core()
    a.stats.reads, b.stats.reads = 2, 5
    a.stats.fetched("https://x/1", 10, 0.001)
    b.stats.fetched("https://y/2", 20, 0.001)
    http = SimpleNamespace(http_status={"200": 7, "404": 1},
                           http_answers={"GET 200": 7, "HEAD 404": 1}, http_bytes_sent=99, http_aborted=0,
                           http_refused=0, http_connections=1)
    latency = Latency()
    latency.observe(0.004)
    sets = {"sets": 3, "sets_open": 2, "max_open_sets": 8, "reload_checks": 4, "set_reloads": 5,
            "set_reload_failures": 6, "set_index_failures": 7,
            "set_states": {SET: {"state": "open", "version": 2}, SET + "2": {"state": "closed",
                                                                              "error": SET}}}
    text = exposition(MetricsCollector(lambda: Reading("http", cores=[a, b], http=http,
                                                       http_latency=latency, sets=sets)))
    assert value(text, "refmount_fetched_bytes_total", protocol="https") == 30
    assert value(text, "refmount_http_requests_total", method="GET", status="200") == 7
    assert value(text, "refmount_http_requests_total", method="HEAD", status="404") == 1
    assert value(text, "refmount_http_sent_bytes_total") == 99
    assert value(text, "refmount_request_duration_seconds_count", frontend="http") == 1
    assert value(text, "refmount_sets_open") == 2
    assert value(text, "refmount_set_opens_total") == 2
    assert value(text, "refmount_sets_failed") == 1
    assert value(text, "refmount_reload_checks_total") == 4
    assert value(text, "refmount_set_reloads_total") == 5
    assert value(text, "refmount_set_reload_failures_total") == 6
    assert value(text, "refmount_set_index_failures_total") == 7
    assert ("refmount_fuse_requests_total", (("kind", "read"),)) not in samples(text)
    assert SET.encode() not in text


def test_labels_stay_bounded_and_nothing_of_a_url_key_or_secret_shows():
    c = core()
    s = c.stats
    schemes = ["https", "http", "s3", "gs", "file", "weird", "x-" + SECRET, "az", "memory"]
    for i in range(10_000):
        scheme = schemes[i % len(schemes)]
        url = f"{scheme}://user:{SECRET}@host{i}.example/{KEY}{i}.nc?X-Amz-Signature={SECRET}{i}"
        s.fetched(url, i, i / 10_000)
        if i % 3 == 0:
            s.retried(url)
        if i % 7 == 0:
            s.failed(f"{KEY}{i}/0.0", FetchError(url, f"boom {SECRET}"))
    s.fetched(f"simplecache::s3://{KEY}/x", 1, 0.1)
    s.fetched(f"/local/{KEY}", 1, 0.1)
    text = exposition(MetricsCollector(lambda: Reading("fuse", cores=[c])))
    assert SECRET.encode() not in text and KEY.encode() not in text and b"host1" not in text
    found = samples(text)
    protocols = {dict(labels)["protocol"] for (name, labels) in found if name == "refmount_fetches_total"}
    assert protocols <= set(PROTOCOLS)
    assert protocols == {"https", "http", "s3", "gs", "file", "other", "az", "memory"}
    assert sum(v for (name, _), v in found.items() if name == "refmount_fetches_total") == 10_002
    assert len(found) < 200  # series: a fixed number, whatever the keys and targets


def test_protocol_of_is_the_scheme_or_a_fixed_word():
    assert protocol_of("S3://b/k") == "s3"
    assert protocol_of("blockcache::gs://b/k") == "gs"
    assert protocol_of("relative/path") == "file"
    assert protocol_of(f"{SECRET}://x") == "other"


def test_latency_buckets_are_cumulative():
    lat = Latency()
    for seconds in (0.00005, 0.0001, 0.003, 100.0):
        lat.observe(seconds)
    buckets = dict(lat.cumulative())
    assert buckets[repr(BUCKETS[0])] == 2  # <= 0.0001: both
    assert buckets["0.005"] == 3
    assert buckets["30.0"] == 3 and buckets["+Inf"] == 4
    assert lat.count == 4


def test_promtool_accepts_the_exposition():
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (scripts/setup.sh installs Debian's prometheus)"
    c = core()
    c.stats.fetched("https://h/x", 5, 0.01)
    c.stats.request_latency.observe(0.001)
    http = SimpleNamespace(http_status={"200": 1}, http_answers={"GET 200": 1}, http_bytes_sent=1,
                           http_aborted=0, http_refused=0,
                           http_connections=0)
    for reading in (Reading("fuse", cores=[c]), Reading("http", cores=[c], http=http,
                                                          http_latency=Latency(), sets={"sets": 1})):
        text = exposition(MetricsCollector(lambda reading=reading: reading))
        r = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()
        assert not r.stdout.strip() and not r.stderr.strip(), r.stdout.decode() + r.stderr.decode()


EXAMPLES = Path(__file__).resolve().parents[3] / "docs" / "examples"


def every_metric_name() -> set[str]:
    c = core()
    c.stats.fetched("https://h/x", 5, 0.01)
    http = SimpleNamespace(http_status={"200": 1}, http_answers={"GET 200": 1}, http_bytes_sent=1,
                           http_aborted=0, http_refused=0,
                           http_connections=0)
    names: set[str] = set()
    for reading in (Reading("fuse", cores=[c]), Reading("http", cores=[c], http=http,
                                                          http_latency=Latency(), sets={"sets": 1})):
        names |= {name for name, _ in samples(exposition(MetricsCollector(lambda r=reading: r)))}
    return names


def test_the_dashboard_asks_only_for_metrics_that_exist():
    dashboard = json.loads((EXAMPLES / "grafana-refmount.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs.append(dashboard["templating"]["list"][1]["query"])
    asked = {name for e in exprs for name in re.findall(r"\brefmount_\w+", e)}
    assert len(asked) > 20
    assert asked <= every_metric_name(), asked - every_metric_name()


def test_the_scrape_example_passes_promtool(tmp_path):
    promtool = shutil.which("promtool")
    assert promtool, "promtool is not installed (scripts/setup.sh installs Debian's prometheus)"
    (tmp_path / "token").write_text("x")
    config = (EXAMPLES / "prometheus-refmount.yml").read_text()
    assert "/etc/prometheus/refmount-token" in config
    (tmp_path / "p.yml").write_text(config.replace("/etc/prometheus/refmount-token", str(tmp_path / "token")))
    r = subprocess.run([promtool, "check", "config", str(tmp_path / "p.yml")], capture_output=True,
                       timeout=60)
    assert r.returncode == 0, r.stdout.decode() + r.stderr.decode()


def test_the_daemonset_example_exports_on_its_annotated_port():
    import yaml

    from refmount.config.options import OPTIONS_BY_NAME

    ds = next(d for d in yaml.safe_load_all((EXAMPLES / "refmount-daemonset.yaml").read_text())
              if d["kind"] == "DaemonSet")
    template = ds["spec"]["template"]
    command = template["spec"]["containers"][0]["command"]
    options = dict(o.partition("=")[::2] for o in command[command.index("-o") + 1].split(","))
    listen = OPTIONS_BY_NAME["metrics"].kind.parse("metrics", options["metrics"])
    port = listen.rpartition(":")[2]
    assert template["metadata"]["annotations"]["prometheus.io/port"] == port
    assert {"name": "metrics", "containerPort": int(port)} in template["spec"]["containers"][0]["ports"]
