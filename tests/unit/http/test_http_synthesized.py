"""What the HTTP front end synthesizes from a set (the consolidated ``.zmetadata``) is bounded
like its inputs: past a bound it is refused with a 503 of fixed text and one log line, made
(or refused) once whatever the number of requests, and left out of the root's listing."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
from test_http_fastpath import Client, CountingCaller, serve

from refmount.config import MountConfig, apply_options
from refmount.core.consolidated import MAX_VALUES
from refmount.core.setcore import SetCore, build_core
from refmount.http.frontend import UNAVAILABLE
from refmount.serving.preparation import index_source


def core_with_attrs(tmp_path: Path, values: int) -> SetCore:
    """A set whose root ``.zattrs`` counts ``values`` JSON values (as core/consolidated.py counts)."""
    zeros = values - 2  # the key, the object and the list, then one per comma
    attrs = '{"a": [' + ",".join("0" * zeros) + "]}"
    refs = {".zgroup": '{"zarr_format":2}', ".zattrs": attrs, "x/.zarray": "{}"}
    source = tmp_path / "refs.json"
    source.write_text(json.dumps(refs))
    cfg = MountConfig(source=str(source), mountpoint="")
    apply_options(cfg, ["no_disk_cache"])
    return build_core(cfg, index_source(cfg))


@pytest.mark.parametrize("over", [False, True], ids=["just-under", "just-over"])
def test_zmetadata_past_its_bound_is_a_503_made_once(tmp_path: Path, caplog, over: bool) -> None:
    # .zgroup and x/.zarray count 2 each (a key, an object): the root .zattrs the rest
    core = core_with_attrs(tmp_path, MAX_VALUES - 4 + over)

    async def body(get: Client, caller: CountingCaller) -> None:
        for _ in range(3):
            r, text = await get("GET", "/.zmetadata")
            if over:
                assert (r.status, text) == (503, (UNAVAILABLE + "\n").encode())
            else:
                assert r.status == 200
                assert len(json.loads(text)["metadata"][".zattrs"]["a"]) == MAX_VALUES - 6
            r, _ = await get("HEAD", "/.zmetadata")
            assert r.status == (503 if over else 200)
        r, page = await get("GET", "/?format=json")
        assert r.status == 200
        names = [e["name"] for e in json.loads(page)["entries"]] if page.startswith(b"{") else page
        assert (".zmetadata" in names) != over, names

    with caplog.at_level(logging.WARNING, logger="refmount"):
        serve(core, body)
    refusals = [r.getMessage() for r in caplog.records if "consolidated metadata" in r.getMessage()]
    assert refusals == (["no consolidated metadata (.zmetadata) is served for this set: its metadata "
                         f"keys hold more than {MAX_VALUES:,} JSON values"] if over else [])
