"""The Prometheus exposition of a mount's or a server's counters, built when it is scraped.

Nothing is counted here: ``MetricsCollector`` reads the counters ``refmount stats`` shows
(``base/stats.py``'s ``Stats`` of each open set, the HTTP server's own, a catalogue's
``describe()``), the latency histograms kept beside them (``base/latency.py``) and a few sizes
of the caches, and turns them into metric families with ``prometheus_client``. Each label has
a fixed set of values (a front end, a kind of request, an HTTP status, a cache, a target
protocol from ``stats.PROTOCOLS``): no URL, key, set name or credential is ever a label or a
value, whatever the sets hold.

Counters never go down while the process runs: the final counts of the set versions it has
closed (``serving/retired.py``'s ``RetiredCounters``, kept by ``sets/opensets.py``) are added
to those of the sets open now. The disk cache's writes, evictions and size are the cache
writer process's own counts, read from the shared memory it is fed through
(``cache/writer.py``'s ``DiskCounters``).

A mount exposes it on a listener of its own (``-o metrics=HOST:PORT``: ``MetricsListener``,
aiohttp's low-level server on the asyncio loop trio is a guest of); ``refmount serve`` at
``/.refmount/metrics`` beside its stats (``http/frontend.py``).
"""

from __future__ import annotations

import errno
import ipaddress
import logging
import socket
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from prometheus_client.core import (
    CollectorRegistry,
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from refmount.base.errors import MountError
from refmount.base.latency import Latency
from refmount.base.stats import ERRORS, FETCHED_BYTES, FETCHES, RETRIES, Stats
from refmount.cache.writer import DiskCounters
from refmount.config import split_listen
from refmount.serving.retired import RetiredCounters

log = logging.getLogger(__name__)

__all__ = ["CONTENT_TYPE", "METRICS_PATH", "MetricsCollector", "MetricsListener", "Reading",
           "exposition"]

CONTENT_TYPE = CONTENT_TYPE_LATEST
METRICS_PATH = "/metrics"  # on a mount's listener (serve: /.refmount/metrics)


@dataclass
class Reading:
    """What one scrape reads: the cores of the sets open now (each with ``stats``, ``reader``
    and ``disk``), counters of no set (a catalogue's requests that reached none), the HTTP
    server's counters and request latency, a catalogue's or reloaded set's ``describe()``
    and the counters of the versions it has closed."""

    frontend: str  # "fuse" or "http"
    cores: list[Any] = field(default_factory=list)
    own: list[Stats] = field(default_factory=list)
    http: Any = None  # http/frontend.py's ServerStats
    http_latency: Latency | None = None
    sets: dict[str, Any] | None = None
    retired: RetiredCounters | None = None


class MetricsCollector:
    """A ``prometheus_client`` collector over ``read()`` (called at each scrape)."""

    def __init__(self, read: Callable[[], Reading]) -> None:
        self.read = read

    def collect(self) -> Iterator[Metric]:
        r = self.read()
        stats = [c.stats for c in r.cores] + r.own
        if r.retired is not None:
            stats.append(r.retired.stats)
        total: dict[str, int] = {}
        for s in stats:
            for name, value in vars(s).items():
                if type(value) is int:
                    total[name] = total.get(name, 0) + value
        started = min((s.started for s in stats), default=None)

        def counter(name: str, doc: str, key: str) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, value=total.get(key, 0))

        info = GaugeMetricFamily("refmount_info", "1, with the front end serving", labels=["frontend"])
        info.add_metric([r.frontend], 1)
        yield info
        if started is not None:
            yield GaugeMetricFamily("refmount_start_time_seconds", "when the counters began (Unix time)",
                                    value=started)
        yield from self._requests(r, total)
        yield counter("refmount_read_bytes", "bytes given to readers (FUSE reads, HTTP bodies of keys)",
                      "bytes_read")
        yield counter("refmount_read_errors", "reads answered with an error (EIO, HTTP 502/504)", "errors")
        yield GaugeMetricFamily("refmount_open_files", "files open now (FUSE)",
                                value=total.get("open_files", 0))
        yield from self._caches(r, total)
        yield from self._fetches(stats, total)
        yield counter("refmount_readahead_fetched_bytes", "bytes fetched ahead of readers", "prefetched")
        yield counter("refmount_readahead_hits", "reads answered from bytes fetched ahead", "prefetch_hits")
        yield counter("refmount_readahead_streams", "streams of keys read in order that began reading ahead",
                      "readahead_streams")
        inflight = sum(c.reader.target_readahead.inflight_bytes for c in r.cores)
        yield GaugeMetricFamily("refmount_inflight_bytes", "bytes being fetched ahead of readers now",
                                value=inflight)
        yield counter("refmount_page_cache_pushed_bytes", "bytes stored in the kernel's page cache at open",
                      "pushed")
        yield counter("refmount_decoded_chunks", "chunks decoded (-o decode), ahead of readers included",
                      "decoded")
        yield counter("refmount_decoded_ahead_chunks", "chunks decoded ahead of a reader", "decoded_ahead")
        yield counter("refmount_pin_refusals", "fetches refused: the target is not its pinned version",
                      "pin_refusals")
        if r.sets is not None:
            yield from self._sets(r.sets)

    @staticmethod
    def _requests(r: Reading, total: dict[str, int]) -> Iterator[Metric]:
        duration = HistogramMetricFamily(
            "refmount_request_duration_seconds",
            "time to answer a request: a FUSE read, or an HTTP request with its body", labels=["frontend"])
        if r.frontend == "fuse":
            kinds = CounterMetricFamily("refmount_fuse_requests", "FUSE requests by kind", labels=["kind"])
            for kind, key in (("lookup", "lookups"), ("open", "opens"), ("read", "reads")):
                kinds.add_metric([kind], total.get(key, 0))
            yield kinds
            latency = Latency()
            for c in r.cores:
                latency.add(c.stats.request_latency)
            if r.retired is not None:
                latency.add(r.retired.stats.request_latency)
            _histogram(duration, ["fuse"], latency)
        if r.http is not None:
            http = r.http
            answers = CounterMetricFamily("refmount_http_requests",
                                          "HTTP requests by method and status of the answer",
                                          labels=["method", "status"])
            for answer, n in sorted(http.http_answers.items()):
                method, _, status = answer.partition(" ")
                if status.isdigit() and len(status) == 3:  # statuses refmount answers: a bounded set
                    answers.add_metric([method, status], n)  # methods: ServerStats.count's few
            yield answers
            yield CounterMetricFamily("refmount_http_sent_bytes", "bytes of HTTP bodies sent",
                                      value=http.http_bytes_sent)
            yield CounterMetricFamily("refmount_http_aborted", "HTTP responses cut off after their headers",
                                      value=http.http_aborted)
            yield CounterMetricFamily("refmount_http_refused", "connections over max_clients, answered 503",
                                      value=http.http_refused)
            yield GaugeMetricFamily("refmount_http_connections", "HTTP connections open now",
                                    value=http.http_connections)
            if r.http_latency is not None:
                _histogram(duration, ["http"], r.http_latency)
        yield duration

    @staticmethod
    def _caches(r: Reading, total: dict[str, int]) -> Iterator[Metric]:
        hits = CounterMetricFamily("refmount_cache_hits", "blocks found in a cache", labels=["cache"])
        hits.add_metric(["memory"], total.get("memory_hits", 0))
        hits.add_metric(["disk"], total.get("disk_hits", 0))
        yield hits
        yield CounterMetricFamily("refmount_cache_misses",
                                  "blocks in no cache: fetched when a reader asked (demand misses)",
                                  value=total.get("misses", 0))
        retired = r.retired or RetiredCounters()
        disk = DiskCounters()
        disk.add(retired.disk)
        held: dict[str, int] = {}  # per cache directory (the sets of a catalogue share one)
        for c in r.cores:
            writer = getattr(c, "writer", None)
            if writer is None or c.disk is None:
                continue
            now = writer.counters()
            disk.add(now)
            # the child's estimate once it has written, else what the start-up scan found (0
            # until it is done)
            estimate = now.held_bytes if now.held_bytes is not None else c.disk.scanned_bytes
            held[c.disk.directory] = max(held.get(c.disk.directory, 0), estimate or 0)
        evictions = CounterMetricFamily("refmount_cache_evictions",
                                        "blocks dropped from a cache to make room", labels=["cache"])
        evictions.add_metric(["memory"], sum(c.reader.memory.evictions for c in r.cores)
                             + retired.memory_evictions)
        evictions.add_metric(["disk"], disk.evictions)
        yield evictions
        yield _disk("refmount_cache_evicted_bytes", "bytes of block files evicted from the disk cache",
                    disk.evicted_bytes)
        yield _disk("refmount_cache_written_bytes", "bytes of block files written to the disk cache "
                    "(headers included)", disk.bytes_written)
        yield _disk("refmount_cache_written_blocks", "block files written to the disk cache",
                    disk.blocks_written)
        yield _disk("refmount_cache_write_errors", "writes to the disk cache that failed (each turns "
                    "writing off for a minute)", disk.write_errors)
        size = GaugeMetricFamily("refmount_cache_bytes", "bytes held by a cache now (disk: an estimate, "
                                 "see docs/operations.md)", labels=["cache"])
        size.add_metric(["memory"], sum(c.reader.memory.size for c in r.cores))
        if held:
            size.add_metric(["disk"], sum(held.values()))
        yield size
        capacity = GaugeMetricFamily("refmount_cache_capacity_bytes", "the bound of a cache",
                                     labels=["cache"])
        capacity.add_metric(["memory"], sum(c.reader.memory.capacity for c in r.cores))
        disks = {id(c.disk): c.disk.capacity for c in r.cores if c.disk is not None}
        if disks:
            capacity.add_metric(["disk"], max(disks.values()))  # the sets share one directory
        yield capacity
        yield CounterMetricFamily("refmount_cache_writes_dropped",
                                  "blocks not written to the disk cache: the disk fell behind",
                                  value=total.get("cache_writes_dropped", 0))

    @staticmethod
    def _fetches(stats: list[Stats], total: dict[str, int]) -> Iterator[Metric]:
        by_protocol: dict[str, list[int]] = {}
        latency = Latency()
        for s in stats:
            latency.add(s.fetch_latency)
            for protocol, counts in s.protocols.items():
                into = by_protocol.setdefault(protocol, [0, 0, 0, 0])
                for i, n in enumerate(counts):
                    into[i] += n
        families = [
            (FETCHES, CounterMetricFamily("refmount_fetches", "requests to targets that succeeded",
                                          labels=["protocol"])),
            (FETCHED_BYTES, CounterMetricFamily("refmount_fetched_bytes", "bytes fetched from targets",
                                                labels=["protocol"])),
            (RETRIES, CounterMetricFamily("refmount_fetch_retries", "requests to targets tried again",
                                          labels=["protocol"])),
            (ERRORS, CounterMetricFamily("refmount_fetch_errors", "reads that failed at a target",
                                         labels=["protocol"])),
        ]
        for i, family in families:
            for protocol, counts in sorted(by_protocol.items()):
                family.add_metric([protocol], counts[i])
            yield family
        yield CounterMetricFamily("refmount_fetches_merged",
                                  "ranges that shared a request with others", value=total.get("merged", 0))
        duration = HistogramMetricFamily("refmount_fetch_duration_seconds",
                                         "time of a request to a target, retries included")
        _histogram(duration, [], latency)
        yield duration

    @staticmethod
    def _sets(d: dict[str, Any]) -> Iterator[Metric]:
        states = d.get("set_states") or {}
        yield GaugeMetricFamily("refmount_sets", "sets the catalogue names", value=d.get("sets", 0))
        yield GaugeMetricFamily("refmount_sets_open", "sets open now", value=d.get("sets_open", 0))
        yield GaugeMetricFamily("refmount_sets_max_open", "most sets open at once (max_open_sets)",
                                value=d.get("max_open_sets", 0))
        opens = d.get("set_opens")  # Sets' count (a removed set's versions stay counted)
        if opens is None:
            opens = sum(int(s.get("version", 0)) for s in states.values())
        yield CounterMetricFamily("refmount_set_opens", "versions of sets opened (first opens and reloads)",
                                  value=opens)
        yield GaugeMetricFamily("refmount_sets_failed", "sets whose last open or reload failed",
                                value=sum(1 for s in states.values() if s.get("error") is not None))
        yield CounterMetricFamily("refmount_set_index_failures", "opens and re-indexings of sets that failed",
                                  value=d.get("set_index_failures", 0))
        yield CounterMetricFamily("refmount_set_reloads", "new versions of sets swapped in by reloads",
                                  value=d.get("set_reloads", 0))
        yield CounterMetricFamily("refmount_set_reload_failures",
                                  "reloads that kept the old version (SOURCE not identified, not indexed, "
                                  "no room)", value=d.get("set_reload_failures", 0))
        yield CounterMetricFamily("refmount_reload_checks", "checks of the sets for changes",
                                  value=d.get("reload_checks", 0))
        yield GaugeMetricFamily("refmount_catalog_unreadable", "1 while the catalogue cannot be read again",
                                value=1 if d.get("catalog_error") else 0)


def _disk(name: str, doc: str, value: int) -> CounterMetricFamily:
    """A counter of the disk cache alone, labelled like the others of the caches."""
    family = CounterMetricFamily(name, doc, labels=["cache"])
    family.add_metric(["disk"], value)
    return family


def _histogram(family: HistogramMetricFamily, labels: list[str], latency: Latency) -> None:
    family.add_metric(labels, latency.cumulative(), latency.total)


def exposition(collector: MetricsCollector) -> bytes:
    """The text exposition of ``collector``'s metrics now."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


# ---- a mount's listener ---------------------------------------------------------------------
def bind(listen: str) -> socket.socket:
    """A listening socket for ``-o metrics=HOST:PORT``; MountError saying why not."""
    host, port = split_listen(listen, "metrics")
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise MountError(f"metrics: cannot listen on {listen}: {e.strerror}") from None
    family, _, _, _, address = infos[0]
    try:
        sock = socket.create_server(address, family=family, backlog=64)
    except OSError as e:
        why = ("the address is in use: choose another port with -o metrics=HOST:PORT"
               if e.errno == errno.EADDRINUSE else e.strerror)
        raise MountError(f"metrics: cannot listen on {listen}: {why}") from None
    if not ipaddress.ip_address(sock.getsockname()[0]).is_loopback:
        log.warning("metrics on %s: other hosts can read them (counters only: no key, URL or "
                    "credential)", listen)
    return sock


class MetricsListener:
    """``GET /metrics`` on a socket of its own, answered on the asyncio loop (aiohttp's
    low-level server): anything else is 404, any method but GET and HEAD 405."""

    def __init__(self, collector: MetricsCollector) -> None:
        from aiohttp import web_server

        self.collector = collector
        self.server = web_server.Server(self._handle, access_log=None, keepalive_timeout=30,
                                        max_line_size=4096, max_field_size=4096, max_headers=32)

    async def _handle(self, request: Any) -> Any:
        from aiohttp import web

        if request.method not in ("GET", "HEAD"):
            return web.Response(status=405, headers={"Allow": "GET, HEAD"}, text="only GET\n")
        if request.rel_url.path != METRICS_PATH:
            return web.Response(status=404, text="metrics are at /metrics\n")
        body = exposition(self.collector)
        return web.Response(status=200, body=b"" if request.method == "HEAD" else body,
                            headers={"Content-Type": CONTENT_TYPE, "Cache-Control": "no-store"})

    async def serve(self, sock: socket.socket) -> None:
        """Answer on ``sock`` until cancelled (a trio task; the server runs on its loop)."""
        import asyncio

        import trio

        from refmount.targets.filesystems import await_task

        loop = asyncio.get_running_loop()
        server = await await_task(loop, loop.create_server(self.server, sock=sock))
        try:
            await trio.sleep_forever()
        finally:
            server.close()
            with trio.CancelScope(shield=True), trio.move_on_after(1.0):
                await await_task(loop, self.server.shutdown(0.5))
