"""DuckDB's httpfs over ``refmount serve --s3-listen``: ``glob('s3://…')`` lists through
ListObjectsV2, ``read_blob``/``read_text`` read through GetObject, anonymous and signed with a key
pair, every value equal to the HTTP view's. The extension is the one the ``duckdb-extension-httpfs``
package ships for the installed DuckDB, loaded from its file (no download)."""

from __future__ import annotations

import json
import pathlib
import urllib.parse

import duckdb  # the test extra: duckdb with duckdb-extension-httpfs of the same release
import pytest
from support.datasets import write_json
from support.servers import free_port

pytestmark = [pytest.mark.timeout(300)]

SECRET = "duck-s3cr3t-0123456789abcdef"


def connect(port: int, signed: tuple[str, str] | None = None):
    import duckdb_extension_httpfs

    ext = (
        pathlib.Path(duckdb_extension_httpfs.__file__).parent
        / "extensions"
        / f"v{duckdb.__version__}"
        / "httpfs.duckdb_extension"
    )
    assert ext.is_file(), f"duckdb-extension-httpfs has no extension for duckdb {duckdb.__version__}"
    con = duckdb.connect(config={"autoinstall_known_extensions": False, "autoload_known_extensions": False})
    con.execute(f"LOAD '{ext}'")
    con.execute(f"SET s3_endpoint='127.0.0.1:{port}'")
    con.execute("SET s3_url_style='path'")
    con.execute("SET s3_use_ssl=false")
    con.execute("SET s3_region='us-east-1'")
    if signed is not None:
        con.execute(f"SET s3_access_key_id='{signed[0]}'")
        con.execute(f"SET s3_secret_access_key='{signed[1]}'")
    return con


@pytest.fixture
def keyset(datasets) -> pathlib.Path:
    refs = {
        ".zgroup": '{"zarr_format":2}',
        "csv/a.csv": "x,y\n1,2\n3,4\n",
        "csv/b.csv": "x,y\n5,6\n",
        "csv/sub/c.csv": "x,y\n7,8\n",
        "txt/sp ace.txt": "space",
        "big": [str(datasets.blob), 1000, 300_000],
    }
    return write_json(datasets.blob.parent.parent / "duckkeys.json", refs)


def check(con, s, keyset: pathlib.Path, bucket: str) -> None:
    globbed = sorted(
        r[0] for r in con.execute(f"SELECT file FROM glob('s3://{bucket}/csv/*.csv')").fetchall()
    )
    assert globbed == [f"s3://{bucket}/csv/a.csv", f"s3://{bucket}/csv/b.csv"]
    deep = sorted(r[0] for r in con.execute(f"SELECT file FROM glob('s3://{bucket}/**')").fetchall())
    keys = sorted([*json.loads(keyset.read_text()), ".zmetadata"])
    assert deep == [f"s3://{bucket}/{k}" for k in keys]
    rows = con.execute(
        f"SELECT filename, content, size FROM read_blob('s3://{bucket}/*') ORDER BY filename"
    ).fetchall()
    assert [r[0] for r in rows] == [f"s3://{bucket}/{k}" for k in (".zgroup", ".zmetadata", "big")]
    for name, content, size in rows:
        http = s.request("GET", "/" + name.rsplit("/", 1)[1])
        assert http.status == 200 and content == http.body and size == len(http.body), name
    text = con.execute(f"SELECT content FROM read_text('s3://{bucket}/txt/sp ace.txt')").fetchone()[0]
    assert text == s.request("GET", "/txt/" + urllib.parse.quote("sp ace.txt")).body.decode()
    total = con.execute(
        f"SELECT sum(x), sum(y), count(*) FROM read_csv('s3://{bucket}/csv/*.csv')"
    ).fetchone()
    assert total == (9, 12, 3)


def test_duckdb_httpfs_anonymous_globs_and_reads_what_the_http_view_serves(serve, keyset):
    port = free_port()
    s = serve(keyset, f"s3_listen=127.0.0.1:{port}", "s3_bucket=duck")
    check(connect(port), s, keyset, "duck")


def test_duckdb_httpfs_signed_with_a_key_pair(serve, keyset, tmp_path):
    secret = tmp_path / "secret"
    secret.write_text(SECRET + "\n")
    port = free_port()
    s = serve(
        keyset,
        f"s3_listen=127.0.0.1:{port}",
        "s3_bucket=duck",
        "s3_access_key=AKIDDUCK",
        f"s3_secret_key=@{secret}",
    )
    check(connect(port, ("AKIDDUCK", SECRET)), s, keyset, "duck")
    with pytest.raises(duckdb.Error, match="403"):
        connect(port, ("AKIDDUCK", "wrong-secret")).execute(
            "SELECT * FROM read_blob('s3://duck/big')"
        ).fetchall()
    with pytest.raises(duckdb.Error, match="403"):
        connect(port).execute("SELECT * FROM glob('s3://duck/csv/*')").fetchall()
