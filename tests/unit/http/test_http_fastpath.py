"""The HTTP front end answers on the asyncio loop, with no call into trio, what needs no I/O
(a HEAD, a 404, a 304, inline bytes, a block in memory), and calls trio for the rest (a
first read, a size to measure, a decoded chunk). Requests are aiohttp's mocked requests
handed to ``HttpFrontEnd.handle`` inside the serving process's loop (trio as a guest of
asyncio); the calls into trio are counted by a ``TrioCaller`` that counts them."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any
from unittest import mock

import numcodecs
import numpy as np
import trio
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from refmount.base import guestloop
from refmount.base.triocall import TrioCaller
from refmount.config import MountConfig, apply_options
from refmount.core.setcore import SetCore, build_core
from refmount.http.frontend import HttpFrontEnd
from refmount.serving.preparation import index_source
from refmount.targets.filesystems import await_task

DATA = bytes(range(256)) * 64


class CountingCaller(TrioCaller):
    def __init__(self, nursery: trio.Nursery) -> None:
        super().__init__(nursery)
        self.calls = 0

    async def call(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        self.calls += 1
        return await super().call(fn, *args)


def make_core(tmp_path: Path, *options: str) -> SetCore:
    (tmp_path / "data.bin").write_bytes(DATA)
    chunk = np.arange(16, dtype="<i4")
    (tmp_path / "chunk.z").write_bytes(numcodecs.Zlib(1).encode(chunk.tobytes()))
    zarray = {"zarr_format": 2, "shape": [16], "chunks": [16], "dtype": "<i4",
              "compressor": {"id": "zlib", "level": 1}, "filters": None, "fill_value": 0,
              "order": "C"}
    refs = {".zgroup": '{"zarr_format":2}', "x/.zarray": json.dumps(zarray), "x/.zattrs": "{}",
            "x/0": [str(tmp_path / "chunk.z"), 0, (tmp_path / "chunk.z").stat().st_size],
            "raw/part": [str(tmp_path / "data.bin"), 100, 5000], "whole": [str(tmp_path / "data.bin")]}
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(refs))
    cfg = MountConfig(source=str(source), mountpoint="")
    apply_options(cfg, ["no_disk_cache", "retries=0", "timeout=5", *options])
    return build_core(cfg, index_source(cfg))


class Client:
    """Mocked requests through ``handle``; a GET's body is what it wrote."""

    def __init__(self, front: HttpFrontEnd) -> None:
        self.front = front

    async def __call__(self, method: str, path: str, **headers: str) -> tuple[web.StreamResponse, bytes]:
        request = make_mocked_request(method, path, headers={k.replace("_", "-"): v
                                                             for k, v in headers.items()})
        response = await self.front.handle(request)
        if isinstance(response, web.Response):
            return response, bytes(response.body or b"")
        written = b"".join(bytes(c.args[0]) for c in request.writer.write.call_args_list)  # type: ignore[attr-defined]
        return response, written


def serve(core: SetCore, body: Callable[[Client, CountingCaller], Awaitable[None]]) -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            core.start(nursery)
            caller = CountingCaller(nursery)
            front = HttpFrontEnd(core, caller, cors=None, token=None, max_clients=8,
                                 client_timeout=5, cache_seconds=1)
            await await_task(asyncio.get_running_loop(), body(Client(front), caller))
            nursery.cancel_scope.cancel()

    try:
        guestloop.run(main)
    finally:
        core.close()


def test_answers_needing_no_io_do_not_enter_trio(tmp_path: Path) -> None:
    core = make_core(tmp_path)

    async def body(get: Client, caller: CountingCaller) -> None:
        r, _ = await get("HEAD", "/raw/part")
        assert (r.status, r.headers["Content-Length"], caller.calls) == (200, "5000", 0)
        r, _ = await get("GET", "/raw/nothing")
        assert (r.status, caller.calls) == (404, 0)
        r, text = await get("GET", "/.zgroup")  # inline
        assert (r.status, text, caller.calls) == (200, b'{"zarr_format":2}', 0)
        r, _ = await get("GET", "/.zgroup/")  # a file named as a directory
        assert (r.status, caller.calls) == (404, 0)
        r, _ = await get("GET", "/raw")  # a directory without its slash
        assert (r.status, caller.calls) == (301, 0)
        assert core.stats.requests == 0  # nothing fetched

        # the first GET reads in trio; the block stays in memory and the next GETs do not
        r, first = await get("GET", "/raw/part")
        assert (r.status, first, caller.calls) == (200, DATA[100:5100], 1)
        r, again = await get("GET", "/raw/part")
        assert (r.status, again, caller.calls) == (200, first, 1)
        r, part = await get("GET", "/raw/part", Range="bytes=10-19")
        assert (r.status, part, caller.calls) == (206, DATA[110:120], 1)
        r, _ = await get("GET", "/raw/part", If_None_Match=r.headers["ETag"])
        assert (r.status, caller.calls) == (304, 1)
        r, _ = await get("GET", "/raw/part", Range="bytes=9000-")
        assert (r.status, caller.calls) == (416, 1)
        assert core.stats.requests == 1

    serve(core, body)


def test_answers_needing_io_or_decoding_enter_trio(tmp_path: Path) -> None:
    async def body(get: Client, caller: CountingCaller) -> None:
        r, _ = await get("HEAD", "/whole")  # a whole-file target's size is measured
        assert (r.status, r.headers["Content-Length"], caller.calls) == (200, str(len(DATA)), 1)
        r, _ = await get("GET", "/.zmetadata")  # synthesized once, in trio
        assert (r.status, caller.calls) == (200, 2)
        r, _ = await get("HEAD", "/.zmetadata")  # then at hand
        assert (r.status, caller.calls) == (200, 2)

    serve(make_core(tmp_path), body)

    async def decoded(get: Client, caller: CountingCaller) -> None:
        r, _ = await get("HEAD", "/x/0")  # a decoded chunk: the view's tree, in trio
        assert (r.status, r.headers["Content-Length"], caller.calls) == (200, "64", 1)
        r, data = await get("GET", "/x/0")
        assert (r.status, data, caller.calls) == (200, np.arange(16, dtype="<i4").tobytes(), 2)

    (tmp_path / "decoded").mkdir()
    serve(make_core(tmp_path / "decoded", "decode"), decoded)


def test_a_client_gone_before_the_headers_is_counted_not_an_error(tmp_path: Path) -> None:
    """Answered without a call into trio, a GET reaches its headers while a client that has
    already gone is still being noticed: an aborted response, not an error of the handler."""
    core = make_core(tmp_path)

    async def body(get: Client, caller: CountingCaller) -> None:
        await get("GET", "/raw/part")  # the block in memory
        gone = mock.Mock()
        gone.write_headers = mock.AsyncMock(return_value=None)
        gone.send_headers = mock.Mock(side_effect=ConnectionResetError("Cannot write to closing transport"))
        request = make_mocked_request("GET", "/raw/part", writer=gone)
        response = await get.front.handle(request)
        assert response.status == 200
        assert get.front.counters()["http_aborted"] == 1
        gone.write.assert_not_called()

    serve(core, body)


def test_keys_read_ahead_are_answered_on_the_loop_and_keep_the_readahead_going(tmp_path: Path) -> None:
    # Keys laid out in order in one target, read one after another (a zarr client going
    # through an array): after the first few, each is inside a stretch read ahead, taken
    # from it on the loop, and the stretches after it are started from the loop too.
    chunk, n = 64 * 1024, 128
    data = np.random.default_rng(5).integers(0, 256, n * chunk, dtype=np.uint8).tobytes()
    (tmp_path / "array.bin").write_bytes(data)
    refs = {f"a/{i}": [str(tmp_path / "array.bin"), i * chunk, chunk] for i in range(n)}
    (tmp_path / "refs.json").write_text(json.dumps(refs))
    cfg = MountConfig(source=str(tmp_path / "refs.json"), mountpoint="")
    apply_options(cfg, ["no_disk_cache", "retries=0", "timeout=5", "block_size=1M", "max_readahead=2M"])
    core = build_core(cfg, index_source(cfg))

    async def body(get: Client, caller: CountingCaller) -> None:
        for i in range(n):
            r, got = await get("GET", f"/a/{i}")
            assert (r.status, got) == (200, data[i * chunk:(i + 1) * chunk]), i
            await asyncio.sleep(0.01)  # the client's own work: stretches arrive meanwhile
        first_pass = caller.calls
        for i in range(n):  # again: every key is in a stretch that has arrived
            r, got = await get("GET", f"/a/{i}")
            assert got == data[i * chunk:(i + 1) * chunk]
        stats = core.stats
        # Only the reads before the readahead started (and any that met a stretch still in
        # flight) entered trio; the readahead ran to the end of the target, started from
        # the loop for all but its first stretch (the window, 2 MiB, is a quarter of it).
        assert first_pass <= 8, first_pass
        assert caller.calls == first_pass
        assert stats.prefetch_hits >= n - first_pass
        assert stats.prefetched >= (n - 8) * chunk
        assert stats.misses <= first_pass

    serve(core, body)
