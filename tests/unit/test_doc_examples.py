"""The manifests of docs/examples/ are valid YAML, and the `refmount serve` replicas of
refmount-serve.yaml read one SOURCE object by URL: a file of each pod's own (a ConfigMap, a
volume) has each pod's own modification time, and replicas' ETags would differ
(docs/operations.md, "Scale past one machine")."""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

EXAMPLES = Path(__file__).resolve().parents[2] / "docs" / "examples"
MANIFESTS = sorted(EXAMPLES.glob("*.yaml"))


def test_there_are_manifests() -> None:
    assert {p.name for p in MANIFESTS} >= {"refmount-serve.yaml", "refmount-daemonset.yaml"}


@pytest.mark.parametrize("path", MANIFESTS, ids=lambda p: p.name)
def test_every_example_manifest_is_yaml_of_kubernetes_objects(path: Path) -> None:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs
    for d in docs:
        assert {"apiVersion", "kind", "metadata"} <= d.keys(), (path.name, d)
        assert d["metadata"].get("name"), (path.name, d)


def test_the_serve_replicas_read_their_source_by_url() -> None:
    docs = list(yaml.safe_load_all((EXAMPLES / "refmount-serve.yaml").read_text()))
    serve = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "refmount-serve")
    pod = serve["spec"]["template"]["spec"]
    command = pod["containers"][0]["command"]
    assert command[:2] == ["refmount", "serve"]
    source = urlsplit(command[2])
    assert source.scheme in ("s3", "gs", "https", "http") and source.netloc and source.path, command
    # nothing of the pod's own holds the set: no ConfigMap or other volume besides the cache
    assert all("configMap" not in v for v in pod.get("volumes", ())), pod["volumes"]
