"""The servers the ``serve`` workload compares ``refmount serve`` with, each a child process:

    python -m bench.serve_peers hypercorn-trio REFS   # prints the port once it listens
    python -m bench.serve_peers xpublish REFS
    python -m bench.serve_peers aiohttp-constant REFS

* ``hypercorn-trio``: a prototype of the other server design considered for ``refmount
  serve``: hypercorn's trio worker inside the same nursery as the set's core (trio as a guest
  of asyncio, as in the serving process), so a request needs no hop from asyncio into trio.
  It answers ``HEAD`` and ``GET`` of a key (whole body, no ranges or validators), which is
  what the comparison of requests per second needs; it is not a front end of the product.
* ``xpublish``: xpublish with its zarr plugin (``xpublish-zarr``: zarr v3 keys under
  ``/zarr/``, chunks encoded per request, answers cached by xpublish) over the same set opened
  with fsspec's reference file system and xarray, run by uvicorn.
* ``aiohttp-constant``: aiohttp's low-level server, configured as ``refmount serve``
  configures it, answering each key of the set with constant bytes of its size from memory
  (no index, validators, ranges or reads; ``404`` for anything else): what the HTTP server
  refmount is built on costs per request on this machine, the ceiling of its requests per
  second.

Nothing here is imported by refmount or its tests.
"""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PIECE = 1 << 20


def listening() -> socket.socket:
    sock = socket.create_server(("127.0.0.1", 0), backlog=1024)
    print(sock.getsockname()[1], flush=True)
    return sock


def hypercorn_trio(refs: str) -> None:
    import trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    sys.path.insert(0, str(REPO))
    from refmount.base import guestloop
    from refmount.config import MountConfig, apply_options
    from refmount.core.setcore import build_core
    from refmount.serving.preparation import index_source

    cfg = MountConfig(source=refs, mountpoint="")
    apply_options(cfg, ["no_disk_cache"])
    core = build_core(cfg, index_source(cfg))
    sock = listening()
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.accesslog = None
    config.errorlog = None
    config.keep_alive_timeout = 60

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                kind = message["type"].rsplit(".", 1)[1]
                await send({"type": f"lifespan.{kind}.complete"})
                if kind == "shutdown":
                    return
        tree = core.tree
        node = tree.root
        for name in scope["path"].lstrip("/").encode().split(b"/"):
            node = await tree.lookup(node, name) if node is not None and node.is_dir else None
        if node is None or node.is_dir:
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        ref = await tree.ref(node)
        size = await tree.size(node)
        if size < 0:
            size = await core.reader.size(ref)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", str(size).encode()),
                                (b"content-type", b"application/octet-stream")]})
        if scope["method"] == "HEAD":
            await send({"type": "http.response.body", "body": b""})
            return
        for at in range(0, size, PIECE):
            data = await core.reader.read(ref, at, min(PIECE, size - at))
            await send({"type": "http.response.body", "body": bytes(data),
                        "more_body": at + PIECE < size})

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            core.start(nursery)
            await serve(app, config)  # type: ignore[arg-type]

    guestloop.run(main, on_loop=core.bind_loop)


def xpublish(refs: str) -> None:
    import uvicorn
    import xarray as xr
    import xpublish as xp
    from xpublish_zarr import ZarrPlugin

    ds = xr.open_dataset("reference://", engine="zarr", consolidated=False, zarr_format=2, chunks={},
                         mask_and_scale=False, storage_options={"fo": json.loads(Path(refs).read_text()),
                                                          "remote_protocol": "http",
                                                          "remote_options": {"asynchronous": True}})
    rest = xp.SingleDatasetRest(ds, plugins={"zarr": ZarrPlugin()})
    sock = listening()
    server = uvicorn.Server(uvicorn.Config(rest.app, log_level="warning", access_log=False))
    server.run(sockets=[sock])


def aiohttp_constant(refs: str) -> None:
    import asyncio

    from aiohttp import web, web_server

    sizes = {k: (len(v) if isinstance(v, str) else v[2] if len(v) == 3 else 0)
             for k, v in json.loads(Path(refs).read_text()).items()}
    bodies = {size: bytes(size) for size in set(sizes.values())}

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        size = sizes.get(request.path.lstrip("/"))
        if size is None:
            return web.Response(status=404, text="no such key")
        if request.method == "HEAD":
            return web.Response(headers={"Content-Length": str(size)})
        return web.Response(body=bodies[size])

    async def main() -> None:
        server = web_server.Server(handle, handler_cancellation=True, access_log=None,
                                   keepalive_timeout=60, max_line_size=8190, max_field_size=8190)
        await asyncio.get_running_loop().create_server(server, sock=listening())
        await asyncio.Event().wait()

    asyncio.run(main())


if __name__ == "__main__":
    {"hypercorn-trio": hypercorn_trio, "xpublish": xpublish,
     "aiohttp-constant": aiohttp_constant}[sys.argv[1]](sys.argv[2])
