"""The S3 dialect's parts without a server: its XML (escaping, ``encoding-type=url``, what
parsers need), SigV4 checked against requests signed by botocore (header and presigned forms,
wrong key or secret, skew, expiry, tampering), and bucket names."""

from __future__ import annotations

import time
import urllib.parse
import xml.etree.ElementTree as ET

import pytest
from botocore.auth import S3SigV4Auth, S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials

from refmount.http.s3auth import Denied, SigV4Checker
from refmount.http.s3request import bucket_name
from refmount.http.s3xml import Bucket, ListItem, ListPage, error_xml, iter_list_buckets, iter_listing

NS = "{http://s3.amazonaws.com/doc/2006-03-01/}"


def listing(page: ListPage, **kw) -> ET.Element:
    args = {
        "bucket": "b&<",
        "prefix": b"p<",
        "delimiter": b"/",
        "max_keys": 2,
        "url": False,
        "v2": True,
        "modified": "2024-01-01T00:00:00.000Z",
    }
    args.update(kw)
    return ET.fromstring(b"".join(iter_listing(page, **args, chunk=16)))


def test_listing_xml_escapes_and_parses():
    page = ListPage([ListItem(b"p<&>\"'\r\tk", 5, '"e"')], [b"p</"], True, next_token="tok")
    doc = listing(page)
    assert doc.find(f"{NS}Name").text == "b&<" and doc.find(f"{NS}Prefix").text == "p<"
    assert doc.find(f"{NS}Contents/{NS}Key").text == "p<&>\"'\r\tk"
    assert doc.find(f"{NS}Contents/{NS}ETag").text == '"e"' and doc.find(f"{NS}KeyCount").text == "2"
    assert doc.find(f"{NS}CommonPrefixes/{NS}Prefix").text == "p</"
    assert (
        doc.find(f"{NS}IsTruncated").text == "true" and doc.find(f"{NS}NextContinuationToken").text == "tok"
    )
    assert doc.find(f"{NS}Contents/{NS}Owner") is None
    v1 = listing(ListPage([ListItem(b"k", 1, '"e"')], next_marker=b"k"), v2=False, marker=b"m", owner=True)
    assert v1.find(f"{NS}Marker").text == "m" and v1.find(f"{NS}NextMarker").text == "k"
    assert v1.find(f"{NS}Contents/{NS}Owner/{NS}ID").text == "refmount"


def test_url_encoding_is_what_botocore_decodes():
    key = b"a b+c/\x01\xff%"
    doc = listing(ListPage([ListItem(key, 1, '"e"')]), url=True, prefix=b"a b")
    text = doc.find(f"{NS}Contents/{NS}Key").text
    assert urllib.parse.unquote_to_bytes(text.replace("+", " ")) == key  # botocore: unquote_plus
    assert doc.find(f"{NS}EncodingType").text == "url" and doc.find(f"{NS}Prefix").text == "a%20b"


def test_bucket_list_and_error_documents():
    doc = ET.fromstring(b"".join(iter_list_buckets([Bucket("x", 0), Bucket("y<", 0)])))
    assert [b.text for b in doc.iter(f"{NS}Name")] == ["x", "y<"]
    err = ET.fromstring(error_xml("NoSuchKey", "no <key>", "/b/k&", "RID", Key="k&"))
    assert err.find("Code").text == "NoSuchKey" and err.find("Resource").text == "/b/k&"
    assert err.find("Key").text == "k&"


def test_bucket_names():
    assert bucket_name("/data/My_Set.v2.json") == "my-set.v2"
    assert bucket_name("s3://b/refs/") == "refs"
    assert bucket_name("/x/a") == "refmount"


AK, SK = "AKIDTEST", "secret/Key+1"
HOST = "127.0.0.1:9000"


def signed(
    method: str, path: str, query: str = "", when: float | None = None, secret: str = SK, key: str = AK
) -> tuple[str, list[tuple[str, str]], dict[str, str]]:
    url = f"http://{HOST}{path}" + (f"?{query}" if query else "")
    req = AWSRequest(method=method, url=url, headers={"Host": HOST})
    signer = S3SigV4Auth(Credentials(key, secret), "s3", "us-east-1")
    if when is None:
        signer.add_auth(req)
    else:
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(when))
        req.context["timestamp"] = stamp
        req.headers["X-Amz-Date"] = stamp
        req.headers["X-Amz-Content-SHA256"] = "UNSIGNED-PAYLOAD"
        signer._inject_signature_to_request(
            req, signer.signature(signer.string_to_sign(req, signer.canonical_request(req)), req)
        )
    split = urllib.parse.urlsplit(req.url)
    pairs = [tuple(p.partition("=")[::2]) for p in split.query.split("&")] if split.query else []
    return split.path, pairs, {k.lower(): v for k, v in req.headers.items()}


def presigned(
    path: str, expires: int = 60, key: str = AK
) -> tuple[str, list[tuple[str, str]], dict[str, str]]:
    req = AWSRequest(method="GET", url=f"http://{HOST}{path}", headers={"Host": HOST})
    S3SigV4QueryAuth(Credentials(key, SK), "s3", "eu-west-1", expires=expires).add_auth(req)
    split = urllib.parse.urlsplit(req.url)
    return split.path, [tuple(p.partition("=")[::2]) for p in split.query.split("&")], {"host": HOST}


def code(call) -> str:
    with pytest.raises(Denied) as e:
        call()
    assert SK not in e.value.message
    return e.value.code


def test_sigv4_header_form():
    checker = SigV4Checker(AK, SK, max_skew=900)
    path, query, headers = signed("GET", "/b/a%20b%2Bc", "list-type=2&prefix=a%2Fb&max-keys=3")
    checker.check("GET", path, query, headers)
    assert code(lambda: checker.check("GET", path, [*query, ("x", "1")], headers)) == "SignatureDoesNotMatch"
    assert code(lambda: checker.check("HEAD", path, query, headers)) == "SignatureDoesNotMatch"
    assert (
        code(
            lambda: checker.check(
                "GET", *signed("GET", "/b/k", secret="nope")[:1], [], signed("GET", "/b/k", secret="nope")[2]
            )
        )
        == "SignatureDoesNotMatch"
    )
    p, q, h = signed("GET", "/b/k", key="AKIDOTHER")
    assert code(lambda: checker.check("GET", p, q, h)) == "InvalidAccessKeyId"
    p, q, h = signed("GET", "/b/k", when=time.time() - 3600)
    assert code(lambda: checker.check("GET", p, q, h)) == "RequestTimeTooSkewed"
    checker.check("GET", p, q, h, now=time.time() - 3600)  # the same request, in its time
    assert code(lambda: checker.check("GET", "/b/k", [], {"host": HOST})) == "AccessDenied"
    assert (
        code(lambda: checker.check("GET", "/b/k", [], {"host": HOST, "authorization": "AWS a:b"}))
        == "AccessDenied"
    )


def test_sigv4_presigned_form():
    checker = SigV4Checker(AK, SK)
    path, query, headers = presigned("/b/some%20key")
    checker.check("GET", path, query, headers)
    assert code(lambda: checker.check("GET", "/b/other", query, headers)) == "SignatureDoesNotMatch"
    assert code(lambda: checker.check("GET", path, query, headers, now=time.time() + 120)) == "AccessDenied"
    assert code(lambda: checker.check("GET", path, query, headers, now=time.time() - 3600)) == "AccessDenied"
    p, q, h = presigned("/b/k", key="AKIDOTHER")
    assert code(lambda: checker.check("GET", p, q, h)) == "InvalidAccessKeyId"
    assert "secret" not in repr(checker)
