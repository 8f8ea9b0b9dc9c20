"""What the HTTP front end does with what zarr, xarray and icechunk users send it,
through ``HttpFrontEnd.handle`` over a real core, without a listening server: empty path
components merged as nginx merges them, a defect answered ``500`` with its CORS headers and
counted, and an Icechunk repository's own chunks read whatever ``allow_local`` names."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request
from support.icechunkrepos import local_virtual_repo
from test_http_fastpath import Client, CountingCaller, make_core, serve
from yarl import URL

from refmount.config import MountConfig, apply_options
from refmount.core.setcore import SetCore, build_core
from refmount.serving.preparation import index_source


class OriginForm(Client):
    """Requests whose target is taken as the server's parser takes an origin-form target
    (``//x`` a path, not an authority as ``yarl.URL("//x")`` would have it)."""

    async def __call__(self, method: str, path: str, **headers: str):  # type: ignore[override]
        request = make_mocked_request(method, "/", headers={k.replace("_", "-"): v
                                                           for k, v in headers.items()})
        request = request.clone(rel_url=URL.build(path=path, encoded=True))
        response = await self.front.handle(request)
        if isinstance(response, web.Response):
            return response, bytes(response.body or b"")
        written = b"".join(bytes(c.args[0]) for c in request.writer.write.call_args_list)  # type: ignore[attr-defined]
        return response, written


def test_empty_path_components_are_merged_as_nginx_merges_them(tmp_path: Path) -> None:
    core = make_core(tmp_path)

    async def body(plain: Client, caller: CountingCaller) -> None:
        get = OriginForm(plain.front)
        r, page = await get("GET", "//")  # what zarr 3 lists given http://host:port/
        assert r.status == 200 and b".zgroup" in page, page[:300]
        for path in ("//.zgroup", "/x//.zarray", "///x///.zarray", "/x/%2F.zarray", "/x%2F%2F.zarray"):
            r, _ = await get("GET", path)
            assert r.status == 200, path
        r, _ = await get("GET", "//x")  # a directory without its slash: redirected, merged
        assert (r.status, r.headers["Location"]) == (301, "/x/")
        r, listing = await get("GET", "/x//", Accept="application/json")
        assert r.status == 200 and ".zarray" in listing.decode()
        r, _ = await get("GET", "//.refmount//stats")
        assert r.status == 200
        for path in ("/x/../x/.zarray", "/./x/.zarray", "/x/%00"):
            r, _ = await get("GET", path)
            assert r.status == 404, path

    serve(core, body)


def test_a_defect_is_a_500_with_cors_headers_counted_in_errors(tmp_path: Path, caplog) -> None:
    core = make_core(tmp_path)

    async def body(get: Client, caller: CountingCaller) -> None:
        front = get.front
        front.cors = "*"
        with mock.patch.object(type(front), "_plan_now", side_effect=RuntimeError("a defect")), \
                caplog.at_level(logging.ERROR):
            r, text = await get("GET", "/x/.zarray", Origin="http://example.org")
        assert r.status == 500
        assert r.headers["Access-Control-Allow-Origin"] == "*"
        assert b"a defect" not in text  # the reason is in the log, not in the answer
        assert core.stats.errors == 1
        assert front.stats.http_status == {"500": 1}
        assert "a defect" in caplog.text

    serve(core, body)


def icechunk_core(repo: Path, *options: str) -> SetCore:
    cfg = MountConfig(source=str(repo), mountpoint="")
    apply_options(cfg, ["no_disk_cache", "retries=0", "timeout=5", *options])
    return build_core(cfg, index_source(cfg))


@pytest.mark.parametrize("serving", [False, True], ids=["mount", "serve"])
def test_allow_local_for_virtual_chunks_leaves_the_repositorys_own_chunks_readable(
        tmp_path: Path, serving: bool) -> None:
    pytest.importorskip("icechunk")
    built = local_virtual_repo(tmp_path / "repo", tmp_path / "netcdf")
    core = icechunk_core(built.root, f"allow_local={built.files}")
    core_cfg_serving = serving
    if core_cfg_serving:  # refmount serve's confinement: as allow_other
        core.close()
        cfg = MountConfig(source=str(built.root), mountpoint="")
        apply_options(cfg, ["no_disk_cache", "retries=0", "timeout=5", f"allow_local={built.files}"])
        cfg.serving = True
        core = build_core(cfg, index_source(cfg))

    async def body(get: Client, caller: CountingCaller) -> None:
        r, native = await get("GET", "/native/c/1")
        assert r.status == 200, native
        assert np.frombuffer(native, "<i4").tolist() == built.native[1000:].tolist()
        r, virtual = await get("GET", "/virtual/c/1")
        assert r.status == 200, virtual
        assert np.frombuffer(virtual, "<f4").tolist() == built.virtual[4:8].tolist()
        assert core.stats.errors == 0

    serve(core, body)


def test_a_local_container_is_named_with_the_allow_local_that_authorises_it(tmp_path: Path,
                                                                              caplog) -> None:
    pytest.importorskip("icechunk")
    built = local_virtual_repo(tmp_path / "repo", tmp_path / "netcdf")
    with caplog.at_level(logging.WARNING):
        core = icechunk_core(built.root)
    warned = [r.getMessage() for r in caplog.records if "virtual chunk container" in r.getMessage()]
    assert len(warned) == 1, warned
    assert f"-o allow_local={built.files}" in warned[0]

    async def body(get: Client, caller: CountingCaller) -> None:
        r, page = await get("GET", "/virtual/c/", Accept="application/json")  # listed, sized
        assert r.status == 200
        entries = json.loads(page)["entries"]
        assert [(e["name"], e.get("size")) for e in entries] == [("0", 16), ("1", 16)], page
        r, _ = await get("GET", "/virtual/c/1")
        assert r.status == 502
        r, _ = await get("GET", "/native/c/0")
        assert r.status == 200

    serve(core, body)
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        icechunk_core(built.root, f"allow_local={built.files}").close()
    assert "virtual chunk container" not in caplog.text
    assert json.dumps  # (json used by the fixtures' helpers)
