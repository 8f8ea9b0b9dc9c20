"""The fetcher and the disk cache without a mount: merged requests that fail, HTTP servers
that ignore Range requests, blocks read back from the cache directory."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Self

import pytest
import trio
from aiohttp import web

from refmount.base.errors import FetchError
from refmount.base.stats import Stats
from refmount.cache.blocks import DiskCache, aligned_buffer, round_up
from refmount.targets.fetch import Fetcher
from refmount.targets.httpread import http_range
from refmount.targets.policy import TargetPolicy
from refmount.targets.rangeanswers import ShortRead

pytestmark = pytest.mark.timeout(600)


def fetcher(root: Path, **kw) -> Fetcher:
    return Fetcher({}, TargetPolicy([str(root)], str(root), None), timeout=10, retries=1,
                   max_connections=4, stats=Stats(), **kw)


def test_a_bad_range_merged_with_good_ones_fails_alone(tmp_path):
    """Ranges asked for together are merged; when the merged request fails because one of
    them lies past the end of the target, the others are still served."""
    blob = bytes(range(200))
    (tmp_path / "t.bin").write_bytes(blob)
    f = fetcher(tmp_path, merge_gap=64 * 1024)
    got: dict[str, object] = {}

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            f.attach(nursery)

            async def one(name: str, start: int, end: int) -> None:
                try:
                    got[name] = await f.cat_range("t.bin", start, end)
                except FetchError as e:
                    got[name] = e

            nursery.start_soon(one, "good", 0, 100)
            nursery.start_soon(one, "good2", 120, 140)
            nursery.start_soon(one, "past the end", 150, 250)

    trio.run(main)
    assert got["good"] == blob[:100]
    assert got["good2"] == blob[120:140]
    assert isinstance(got["past the end"], FetchError)


class LoopbackServer:
    """An aiohttp server on loopback, in a thread of its own, answering ``GET /{name}`` with
    ``_handle``; ``url`` names ``path`` on it. A context manager."""

    path = "t.bin"

    def __init__(self) -> None:
        self.url = ""
        self._ready = threading.Event()
        self._stop: object = None
        self._thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        raise NotImplementedError

    def _run(self) -> None:
        import asyncio

        async def serve() -> None:
            app = web.Application()
            app.router.add_get("/{name}", self._handle)
            runner = web.AppRunner(app)
            await runner.setup()
            site = web.TCPSite(runner, "127.0.0.1", 0)
            await site.start()
            self.url = f"http://127.0.0.1:{runner.addresses[0][1]}/{self.path}"
            stop = asyncio.Event()
            self._stop = (asyncio.get_running_loop(), stop)
            self._ready.set()
            await stop.wait()
            await runner.cleanup()

        asyncio.run(serve())

    def __enter__(self) -> Self:
        self._thread.start()
        assert self._ready.wait(10)
        return self

    def __exit__(self, *exc: object) -> None:
        loop, stop = self._stop  # type: ignore[misc]
        loop.call_soon_threadsafe(stop.set)
        self._thread.join(10)


class RangeIgnoringServer(LoopbackServer):
    """Answers every GET with 200 and a chunked body of ``size`` bytes (no Content-Length,
    Range ignored); counts the bytes it managed to send."""

    path = "big.bin"

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size
        self.sent = 0

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200)
        resp.enable_chunked_encoding()
        await resp.prepare(request)
        piece = b"x" * 2**16
        try:
            while self.sent < self.size:
                await resp.write(piece)
                self.sent += len(piece)
        except (ConnectionError, RuntimeError):
            pass  # the client went away
        return resp


def test_a_server_ignoring_range_is_not_downloaded_whole():
    """A 200 without a length, for a range at offset 0, is read only up to one byte past
    the range and refused: the object (256 MiB here) is never read into memory."""
    import asyncio

    from fsspec.implementations.http import HTTPFileSystem

    with RangeIgnoringServer(256 * 2**20) as server:

        async def main() -> None:
            fs = HTTPFileSystem(asynchronous=True)
            try:
                with pytest.raises(ShortRead):
                    await http_range(fs, server.url, 0, 4096)
            finally:
                session = await fs.set_session()
                await session.close()

        asyncio.run(main())
    assert server.sent < 64 * 2**20, f"the server sent {server.sent} bytes for a 4 KiB range"


def test_small_blocks_read_from_disk_do_not_keep_their_read_buffer(tmp_path):
    """A block read with direct I/O lands in an aligned buffer with its 4 KiB header; a
    small block is copied out, so the memory cache (which counts only the block) does not
    hold 12 KiB for every 1 KiB chunk. Big blocks stay views: no copy of megabytes."""
    disk = DiskCache(str(tmp_path), 2**30)
    for length in (1000, 2**20):
        data = bytes(range(256)) * (length // 256) + bytes(length % 256)
        padded = aligned_buffer(round_up(length, 4096))  # like the writer's ring
        padded[:length] = data
        padded[length:] = bytes(len(padded) - length)
        disk.put_digest(disk.key_digest("u", 0, length), length, padded)
        got = disk.get("u", 0, length)
        assert got is not None and bytes(got) == data
        if length < DiskCache.COPY_BELOW:
            assert isinstance(got, bytes)
        elif disk.direct:
            assert isinstance(got, memoryview)


class HeldBodyServer(LoopbackServer):
    """Answers a Range GET of a ``size``-byte target (byte i is i % 251) with a 206 whose
    body stops after ``first`` bytes until ``release`` is set (at most 20 s), then sends the
    rest."""

    def __init__(self, size: int, first: int) -> None:
        super().__init__()
        self.size, self.first = size, first
        self.release = threading.Event()

    def content(self, start: int, end: int) -> bytes:
        return bytes(i % 251 for i in range(start, end))

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        import asyncio

        first, last = request.headers["Range"].removeprefix("bytes=").split("-")
        start, end = int(first), min(int(last) + 1, self.size)
        resp = web.StreamResponse(status=206, headers={
            "Content-Range": f"bytes {start}-{end - 1}/{self.size}", "Accept-Ranges": "bytes"})
        resp.content_length = end - start
        await resp.prepare(request)
        body = self.content(start, end)
        await resp.write(body[: self.first])
        await asyncio.get_running_loop().run_in_executor(None, self.release.wait, 20)
        await resp.write(body[self.first :])
        return resp

    def __exit__(self, *exc: object) -> None:
        self.release.set()
        super().__exit__(*exc)


def test_readers_of_a_stretch_get_their_part_before_the_rest_of_its_response(tmp_path):
    """Readahead's stretch is one request of up to 8 MiB. Its body streams from the HTTP
    client on the asyncio loop into the stretch, and a trio reader of a key at its start is
    woken as soon as that key's bytes are in -- here while the server still holds back the
    rest of the response."""
    from refmount.base import guestloop
    from refmount.core.targetreadahead import TargetReadahead

    chunk = 64 * 1024
    with HeldBodyServer(32 * 2**20, first=2**20) as server:
        f = fetcher(tmp_path)
        got: dict[str, object] = {}

        async def main() -> None:
            async with trio.open_nursery() as nursery:
                f.attach(nursery)
                ra = TargetReadahead(f, Stats(), capacity=64 * 2**20, max_window=8 * 2**20,
                                     grid=4 * 2**20, links=f.links)
                keys = ra.MIN_STREAK + 1  # keys in order, read on demand: a stretch follows
                for i in range(keys):
                    ra.note(server.url, i * chunk, (i + 1) * chunk, nursery, miss=True)
                s = keys * chunk
                with trio.fail_after(10):
                    first = await ra.lookup(server.url, s, s + chunk)
                got["held back while served"] = not server.release.is_set()
                got["first"] = bytes(first[0]) if first is not None else None
                server.release.set()
                with trio.fail_after(10):
                    late = await ra.lookup(server.url, s + 4 * 2**20, s + 4 * 2**20 + chunk)
                got["late"] = bytes(late[0]) if late is not None else None
                nursery.cancel_scope.cancel()

        guestloop.run(main, on_loop=f.bind_loop, before_close=f.aclose)
        s = (TargetReadahead.MIN_STREAK + 1) * chunk
        assert got["first"] == server.content(s, s + chunk)
        assert got["held back while served"]
        assert got["late"] == server.content(s + 4 * 2**20, s + 4 * 2**20 + chunk)


def test_closing_one_fetcher_leaves_the_others_on_the_loop_reading(tmp_path):
    """Each set of a catalogue (and each version of a set being reloaded) has a fetcher of
    its own on the daemon's loop; closing one (its HTTP sessions) must not close the
    session another one reads through."""
    from refmount.base import guestloop

    with HeldBodyServer(2**20, first=2**20) as server:
        first, second = fetcher(tmp_path), fetcher(tmp_path)
        got: list[bytes] = []

        async def main() -> None:
            got.append(await first.cat_range(server.url, 0, 100))
            await first.aclose()
            with trio.fail_after(10):
                got.append(await second.cat_range(server.url, 100, 200))

        def on_loop(loop: object) -> None:
            first.bind_loop(loop)  # type: ignore[arg-type]
            second.bind_loop(loop)  # type: ignore[arg-type]

        guestloop.run(main, on_loop=on_loop, before_close=second.aclose)
        assert got == [server.content(0, 100), server.content(100, 200)]


def test_redirects_of_version_probes_and_chained_http_links(tmp_path):
    """The version probe (what pins and ``refmount verify`` ask: a HEAD) follows a redirect only
    as a read does: out of the rule's prefix it fails naming the redirect and the location is
    never requested; to a location a rule covers it is that rule's header that is sent. A
    chained URL's HTTP link (read by fsspec itself) refuses every redirect."""
    import json as _json

    from support.faultserver import FaultServer

    from refmount.targets.rules import TargetRules

    (tmp_path / "srv").mkdir()
    with FaultServer(tmp_path / "srv") as srv:
        a = srv.url
        srv.put("obj", b"OUTSIDE" * 10)
        srv.put("pub/a", b"INSIDE" * 10)
        srv.put("dest/b", b"DEST" * 10)
        srv.redirect("/pub/same", f"{a}/obj")
        srv.redirect("/pub/ok", f"{a}/dest/b")
        rules = TargetRules.from_json(_json.loads(_json.dumps([
            {"prefix": f"{a}/pub/", "options": {"headers": {"X-Key": "SENTINEL-A"}}},
            {"prefix": f"{a}/dest/", "options": {"headers": {"X-Key": "dest"}}}])))
        f = fetcher(tmp_path, rules=rules)

        async def probe(url: str) -> object:
            try:
                return await f.version(url)
            except FetchError as e:
                return e

        refused = trio.run(probe, f"{a}/pub/same")
        assert isinstance(refused, FetchError)
        assert f"redirect (302) from {a}/pub/same to {a}/obj not followed" in str(refused)
        assert srv.count("/obj", None) == 0
        ok = trio.run(probe, f"{a}/pub/ok")
        assert not isinstance(ok, FetchError) and ok.size == 40
        assert [r.headers.get("X-Key") for r in srv.log("/dest/b", None)] == ["dest"]
        # a destination presigned for GET only (S3 answers HEAD 403): its size by a GET
        srv.reset_log()
        srv.add_fault("/dest/b", "status", None, status=403, methods=("HEAD",))
        ok = trio.run(probe, f"{a}/pub/ok")
        assert not isinstance(ok, FetchError) and ok.size == 40, ok
        assert [(r.method, r.status) for r in srv.log("/dest/b", None)] == [("HEAD", 403), ("GET", 206)]

        plain = fetcher(tmp_path)
        assert trio.run(plain.cat_range, f"simplecache::{a}/pub/a", 0, 6) == b"INSIDE"
        with pytest.raises(FetchError):
            trio.run(plain.cat_range, f"simplecache::{a}/pub/same", 0, 6)
        assert srv.count("/obj", None) == 0
