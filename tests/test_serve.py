"""``xetfs serve`` with the real clients: huggingface_hub, hf_xet, transformers and safetensors.

The store is packed from a Hugging Face cache written by huggingface_hub's
own functions (``hub_cache.py``).  The server runs as ``python -m xetfs
serve`` on 127.0.0.1 (``servers.xetfs_serve``); every client run is a child
process (``serve_clients.py``) with ``HF_ENDPOINT`` at the server and a
fresh ``HF_HUB_CACHE``, and what lands in that cache is compared byte for
byte with the original.  Tree listings are served three entries a page, so
``snapshot_download`` follows the pagination.
"""

from __future__ import annotations

import hashlib
import http.client
import importlib.util
import itertools
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from helpers import hub_cache
from helpers.damage import damage_one_file
from helpers.mounting import wait_until
from helpers.oracle import REPO_ROOT, hf_xet_env
from helpers.processes import children, state
from helpers.servers import (
    S3_ENV,
    Server,
    fault_proxy,
    free_port,
    moto_s3,
    nginx,
    nginx_balancer,
    settled,
    upload_dir,
    xetfs_serve,
)

from xetfs.base import hashes
from xetfs.serve.signing import Signer
from xetfs.storage.catalogue import CATALOGUE_NAME, load_catalogue
from xetfs.storage.remote import LISTING_NAME

pytestmark = pytest.mark.e2e

HERE = Path(__file__).resolve().parent
MODEL, DATASET = hub_cache.MODEL, hub_cache.DATASET
PAGE = "3"  # tree entries per page
MAX_FETCH = "300K"  # so files span several xorb ranges, and terms are cut where a range ends


@dataclass
class Packed:
    spec: hub_cache.CacheSpec
    store: Path
    tmp: Path

    def original(self, repo: str, commit: str, path: str) -> bytes:
        return self.spec.files[(repo, commit, path)]


def pack(tmp: Path, cache: Path, store: Path) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "xetfs", "pack", "--hub-cache", str(cache), str(store), "--no-progress"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=hf_xet_env(tmp / "hf_xet"), timeout=180, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    tmp = tmp_path_factory.mktemp("serve")
    spec = hub_cache.make_hub_cache(tmp / "cache")
    pack(tmp, spec.root, tmp / "store")
    return Packed(spec, tmp / "store", tmp)


@pytest.fixture(scope="module")
def server(packed: Packed) -> Iterator[Server]:
    # Two server processes on one port, whatever the cores: every test below also shows that no request
    # depends on which process answered an earlier one.
    with xetfs_serve(packed.store, "--tree-page-size", PAGE, "--max-fetch", MAX_FETCH, "--workers", "2") as s:
        yield s


_caches: list[Path] = []  # where ``clients`` makes its caches (``_client_caches``)


@pytest.fixture(scope="module", autouse=True)
def _client_caches(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The clients' caches go under pytest's own temporary directory, which pytest cleans after a few runs."""
    _caches.append(tmp_path_factory.mktemp("serve-clients"))
    yield
    _caches.pop()


def clients(
    server: Server, *args: str, xet: bool = True, token: str | None = None, extra: dict[str, str] | None = None
) -> tuple[dict[str, Any], Path]:
    """``serve_clients.py ARGS`` against ``server`` with a fresh cache (and ``extra`` in the environment):
    its report and the cache."""
    tmp = Path(tempfile.mkdtemp(prefix="client-", dir=_caches[-1]))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGINGFACE_"))}
    env.update(HF_ENDPOINT=server.url, HF_HUB_CACHE=str(tmp / "hub"), HF_HOME=str(tmp / "home"),
               HF_XET_CACHE=str(tmp / "xet"), HF_HUB_DISABLE_TELEMETRY="1", DO_NOT_TRACK="1", NO_COLOR="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", TRANSFORMERS_VERBOSITY="error")  # fmt: skip
    if not xet:
        env["HF_HUB_DISABLE_XET"] = "1"
    if token is not None:
        env["HF_TOKEN"] = token
    else:
        env["HF_HUB_DISABLE_IMPLICIT_TOKEN"] = "1"
    env.update(extra or {})
    script = HERE / "helpers" / "serve_clients.py"
    proc = subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                          env=env, timeout=300, check=False)  # fmt: skip
    assert proc.returncode == 0, f"{proc.stderr}\n--- server log ---\n{log_of(server)}"
    return json.loads(proc.stdout), tmp / "hub"


def log_of(server: Server) -> str:
    return server.log.read_text(errors="replace") if server.log else ""


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


Answer = tuple[int, dict[str, str], bytes]


def request(server: Server, method: str, path: str, headers: dict[str, str] | None = None) -> Answer:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
    finally:
        conn.close()


# -- the clients, through hf_xet and without it ----------------------------------------------


def check_report(packed: Packed, report: dict[str, Any], cache: Path) -> None:
    c1, c2, c3 = packed.spec.model_commits
    commits = {"main": c3, "v1.0": c1, "refs/pr/1": c2, c2: c2}
    for key, (path, digest) in report["hf_hub_download"].items():
        rev, name = key.split(":", 1)
        if rev == "dataset":
            repo, commit = DATASET, packed.spec.dataset_commit
            folder = "datasets--acme--tiny-data"
        else:
            repo, commit = MODEL, commits[rev]
            folder = "models--acme--tiny-bert"
        original = packed.original(repo, commit, name)
        assert path == f"{folder}/snapshots/{commit}/{name}", key
        assert digest == sha(original), key
        assert (cache / path).read_bytes() == original, key
    assert len(report["hf_hub_download"]) == 4 * 3 + 2
    snapshots = report["snapshot_download"]
    wanted = (("main", MODEL, c3), ("v1.0", MODEL, c1), ("dataset", DATASET, packed.spec.dataset_commit))
    for key, repo, commit in wanted:
        folder, files = snapshots[key]
        expected = {p: d for (r, c, p), d in packed.spec.files.items() if (r, c) == (repo, commit)}
        assert sorted(files) == sorted(expected), key
        for path, data in expected.items():
            assert (cache / folder / path).read_bytes() == data, (key, path)  # byte-identical to the original
    assert report["AutoConfig"] == ["BertConfig", 32, len(hub_cache.WORDS) + 2]
    words = ["hello", "xet", "store", "offline", "mount"]
    assert report["AutoTokenizer"][1] == [hub_cache.WORDS.index(w) + 2 for w in words]
    weights = packed.original(MODEL, c3, "model.safetensors")
    from safetensors.numpy import load

    assert report["safe_open"] == {k: sha(v.tobytes()) for k, v in sorted(load(weights).items())}
    errors = report["errors"]
    assert errors["repo"]["error"] == "RepositoryNotFoundError", errors
    assert errors["revision"]["error"] == "RevisionNotFoundError", errors
    assert errors["file"]["error"] == "RemoteEntryNotFoundError", errors
    assert errors["snapshot_revision"]["error"] == "RevisionNotFoundError", errors
    assert f"models--acme--tiny-bert/.no_exist/{c3}/no-such-file.json" in report["no_exist"]


def test_clients_through_hf_xet(packed: Packed, server: Server) -> None:
    before = len(log_of(server))
    report, cache = clients(server, "all", packed.spec.model_commits[1])
    check_report(packed, report, cache)
    log = log_of(server)[before:]
    assert "GET /v2/reconstructions/" in log  # the Xet files went through the CAS
    assert " 206 " in log and "GET /xorbs/" in log
    assert "cursor=" not in log  # (queries are never logged)
    assert "ERROR" not in log and "Traceback" not in log, log
    check_packed_again(packed, cache)


def check_packed_again(packed: Packed, cache: Path) -> None:
    """The cache the clients wrote, packed into a store of its own, holds every file they downloaded, with the
    same content as the first store.  huggingface_hub keeps a file it fetched through Xet in the cache's store
    shared by all repos (``blobs/<2 hex>/<xet hash>``), and makes the repo's blob a symlink to it."""
    shared = [p for p in (cache / "blobs").glob("??/*") if len(p.name) == 64]
    if importlib.util.find_spec("huggingface_hub.utils._shared_blobs") is not None:  # (1.32 and later)
        assert shared, sorted(str(p.relative_to(cache)) for p in cache.rglob("*"))[:40]
        link = next(p for p in cache.glob("models--*/blobs/*") if p.is_symlink())
        assert (link.parent / os.readlink(link)).resolve() in {p.resolve() for p in shared}
    again = cache.parent / "again"
    proc = subprocess.run(
        [sys.executable, "-m", "xetfs", "pack", "--hub-cache", str(cache), str(again), "--no-progress"],
        capture_output=True, text=True, cwd=REPO_ROOT, env=hf_xet_env(cache.parent / "hf_xet"), timeout=180,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0 and "skipping" not in proc.stderr, proc.stderr
    first, second = (load_catalogue(store / CATALOGUE_NAME) for store in (packed.store, again))
    checked = 0
    for repo in second.repos:
        original = first.repo(repo.type, repo.id)
        assert original is not None, repo.id
        for commit, rev in repo.revisions.items():
            assert rev.files, (repo.id, commit)
            for path, blob in rev.files.items():
                assert original.revisions[commit].files[path] == blob, (repo.id, commit, path)
                assert repo.blobs[blob].xet_hash == original.blobs[blob].xet_hash, (repo.id, commit, path)
                checked += 1
    assert checked > 0 and checked >= len(shared)


def test_clients_without_hf_xet(packed: Packed, server: Server) -> None:
    before = len(log_of(server))
    report, cache = clients(server, "all", packed.spec.model_commits[1], xet=False)
    check_report(packed, report, cache)
    log = log_of(server)[before:]
    assert "reconstructions" not in log and "/xorbs/" not in log and "xet-read-token" not in log
    assert "GET /acme/tiny-bert/resolve/" in log
    assert "ERROR" not in log and "Traceback" not in log, log


@pytest.mark.parametrize(
    ("setting", "route"),
    [("HF_XET_CLIENT_RECONSTRUCTION_API_VERSION", "GET /v1/reconstructions/"),
     ("HF_XET_CLIENT_ENABLE_MULTIRANGE_FETCHING", "GET /v2/reconstructions/")],
    ids=["v1", "multirange"],
)  # fmt: skip
def test_hf_xet_settings(packed: Packed, server: Server, setting: str, route: str) -> None:
    """hf_xet forced to the v1 answers, or asking for several ranges at once (it gets one a URL)."""
    value = "1" if setting.endswith("VERSION") else "true"
    before = len(log_of(server))
    c1 = packed.spec.model_commits[0]
    got, _ = clients(server, "get", "model", MODEL, "model.safetensors", c1, extra={setting: value})
    assert got.get("sha256") == sha(packed.original(MODEL, c1, "model.safetensors")), got
    log = log_of(server)[before:]
    assert route in log and "GET /xorbs/" in log, log


# -- the protocol, seen with a plain HTTP client -----------------------------------------------


def test_head_carries_the_hub_metadata(packed: Packed, server: Server) -> None:
    _, c2, c3 = packed.spec.model_commits
    weights = packed.original(MODEL, c2, "model.safetensors")
    status, h, _ = request(server, "HEAD", f"/{MODEL}/resolve/refs%2Fpr%2F1/model.safetensors")
    assert status == 200
    assert h["x-repo-commit"] == c2
    assert h["etag"] == h["x-linked-etag"] == f'"{sha(weights)}"'
    assert h["x-linked-size"] == h["content-length"] == str(len(weights))
    assert hashes.is_hex(h["x-xet-hash"])
    assert h["link"] == f'<{server.url}/api/models/{MODEL}/xet-read-token/{c2}>; rel="xet-auth"'
    assert h["cache-control"] == "no-cache"  # a ref may move
    status, h, _ = request(server, "HEAD", f"/{MODEL}/resolve/{c2}/config.json")
    config = packed.original(MODEL, c2, "config.json")
    assert h["etag"] == f'"{hub_cache.git_sha1(config)}"'  # a regular file: its git blob id, and no Xet
    assert "x-xet-hash" not in h and "link" not in h
    assert "immutable" in h["cache-control"]
    status, h, body = request(server, "GET", f"/{MODEL}/resolve/main/config.json",
                              {"If-None-Match": f'W/"{hub_cache.git_sha1(config)}"'})  # fmt: skip
    assert (status, body, h["x-repo-commit"]) == (304, b"", c3)  # a proxy revalidating its copy
    status, h, _ = request(server, "HEAD", f"/datasets/{DATASET}/resolve/main/data/train.parquet")
    assert status == 200 and h["x-repo-commit"] == packed.spec.dataset_commit


def test_plain_get_with_range(packed: Packed, server: Server) -> None:
    c3 = packed.spec.model_commits[2]
    weights = packed.original(MODEL, c3, "model.safetensors")
    path = f"/{MODEL}/resolve/main/model.safetensors"
    status, h, body = request(server, "GET", path, {"Range": "bytes=1000-200999"})
    assert (status, h["content-range"], body) == (206, f"bytes 1000-200999/{len(weights)}", weights[1000:201000])
    status, h, body = request(server, "GET", path, {"Range": f"bytes={len(weights) - 10}-{len(weights) + 500}"})
    assert (status, body) == (206, weights[-10:])  # an end past the file is clamped
    status, h, body = request(server, "GET", path, {"Range": f"bytes={len(weights)}-"})
    assert status == 416 and h["content-range"] == f"bytes */{len(weights)}"
    status, h, body = request(server, "GET", path)
    assert (status, body) == (200, weights)


def test_errors_carry_the_hub_codes(packed: Packed, server: Server) -> None:
    c3 = packed.spec.model_commits[2]
    cases = [
        ("/acme/nothing/resolve/main/config.json", "RepoNotFound", None),
        (f"/{MODEL}/resolve/nothing/config.json", "RevisionNotFound", None),
        (f"/{MODEL}/resolve/main/nothing.json", "EntryNotFound", c3),
        (f"/{MODEL}/resolve/main/%E2%82%AC.json", "EntryNotFound", c3),  # (not Latin-1: escaped in the header)
        (f"/api/models/{MODEL}/tree/main/additional_chat_templates", "EntryNotFound", c3),
        (f"/api/datasets/{MODEL}/revision/main", "RepoNotFound", None),
    ]
    for path, code, commit in cases:
        status, h, _ = request(server, "GET", path)
        assert (status, h.get("x-error-code"), h.get("x-repo-commit")) == (404, code, commit), path
        assert h["cache-control"] == "no-store"


def test_a_dataset_is_browsed_without_a_download(packed: Packed, server: Server) -> None:
    """What a data engineer asks without downloading: refs, paths info, file metadata, and HfFileSystem under
    pyarrow and duckdb (duckdb asks each file's time: ``paths-info`` with ``expand``)."""
    got, _ = clients(server, "browse")
    c1, c2, c3 = packed.spec.model_commits
    assert got["refs"] == {"branches": [["main", c3], ["v1.0", c1]], "pull_requests": [["refs/pr/1", c2]]}, got["refs"]
    assert got["paths_info"] == [["RepoFile", "data/train.parquet", 300_000], ["RepoFolder", "data", None]]
    commit = packed.spec.dataset_commit
    for name, (size, blob_id, lfs) in got["siblings"].items():
        data = packed.original(DATASET, commit, name)
        assert size == len(data), name
        if name.endswith(".parquet"):
            assert lfs == sha(data) and blob_id != lfs
        else:
            assert lfs is None and blob_id == hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
    assert got["ls"] == [f"datasets/{DATASET}/data/train.csv", f"datasets/{DATASET}/data/train.parquet"]
    assert got["modified"].startswith("20")
    rows = packed.original(DATASET, commit, "data/train.csv").decode().splitlines()
    assert got["pyarrow_rows"] == len(rows) == 2000
    assert got["duckdb"] == [2000, sum(int(r.split(",")[0]) for r in rows)]
    status, _, body = request(server, "GET", f"/api/models/{MODEL}/commits/main")
    assert status == 404 and b"xetfs serve does not answer this" in body, body
    assert request(server, "POST", f"/api/models/{MODEL}/tree/main")[0] == 405
    for body in (b'{"paths": 5}', json.dumps({"paths": ["a"] * 1001}).encode()):
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
        conn.request("POST", f"/api/models/{MODEL}/paths-info/main", body, {"Content-Type": "application/json"})
        answer = conn.getresponse()
        assert answer.status == 400 and b"at most 1000" in answer.read()
        conn.close()
    assert request(server, "GET", f"/api/models/{MODEL}/paths-info/main")[0] == 405
    status, _, body = request(server, "GET", "/api/models/acme/no-such-model/refs")
    assert status == 404 and b"Repository not found" in body, body


def test_tree_listing_is_paginated(packed: Packed, server: Server) -> None:
    c1 = packed.spec.model_commits[0]
    entries: list[dict[str, Any]] = []
    path = f"/api/models/{MODEL}/tree/v1.0?recursive=true&expand=false"
    pages = 0
    while path:
        status, h, body = request(server, "GET", path)
        assert status == 200
        entries += json.loads(body)
        pages += 1
        link = h.get("link")
        path = ""
        if link is not None:
            url = link.split(">")[0].lstrip("<")
            assert link.endswith('rel="next"') and url.startswith(server.url)
            path = url[len(server.url) :]
    files = {e["path"]: e for e in entries if e["type"] == "file"}
    assert sorted(files) == sorted(p for (r, c, p) in packed.spec.files if (r, c) == (MODEL, c1))
    assert [e["path"] for e in entries if e["type"] == "directory"] == ["notes"]
    assert pages == -(-len(entries) // int(PAGE))
    weights = packed.original(MODEL, c1, "model.safetensors")
    lfs = files["model.safetensors"]["lfs"]
    assert lfs["oid"] == sha(weights) and lfs["size"] == len(weights) and lfs["pointerSize"] > 0
    assert hashes.is_hex(files["model.safetensors"]["xetHash"])
    config = packed.original(MODEL, c1, "config.json")
    assert files["config.json"]["oid"] == hub_cache.git_sha1(config) and "lfs" not in files["config.json"]
    status, _, body = request(server, "GET", f"/api/models/{MODEL}/tree/v1.0/notes")
    assert [e["path"] for e in json.loads(body)] == ["notes/training.txt"]


def test_xet_token_route_answers_both_ways(packed: Packed, server: Server) -> None:
    c3 = packed.spec.model_commits[2]
    status, h, body = request(server, "GET", f"/api/models/{MODEL}/xet-read-token/{c3}")
    doc = json.loads(body)
    assert status == 200 and h["cache-control"] == "no-store"
    assert (h["x-xet-access-token"], int(h["x-xet-token-expiration"]), h["x-xet-cas-url"]) == (
        doc["accessToken"], doc["exp"], doc["casUrl"])  # fmt: skip
    assert doc["casUrl"] == server.url and doc["exp"] > time.time() + 600
    status, _, _ = request(server, "GET", f"/api/models/{MODEL}/xet-read-token/refs/pr/1")
    assert status == 200


def test_reconstruction_needs_a_xet_token_and_clamps(packed: Packed, server: Server) -> None:
    _, h, _ = request(server, "HEAD", f"/{MODEL}/resolve/main/model.safetensors")
    file_id, size = h["x-xet-hash"], int(h["x-linked-size"])
    path = f"/v1/reconstructions/{file_id}"
    assert request(server, "GET", path)[0] == 401
    assert request(server, "GET", path, {"Authorization": "Bearer 1.2.3"})[0] == 401
    _, _, body = request(server, "GET", f"/api/models/{MODEL}/xet-read-token/main")
    auth = {"Authorization": f"Bearer {json.loads(body)['accessToken']}"}
    status, h, body = request(server, "GET", path, {**auth, "Range": f"bytes=0-{size + 1 << 28}"})
    assert status == 200 and h["cache-control"] == "no-store"
    doc = json.loads(body)
    assert sum(t["unpacked_length"] for t in doc["terms"]) == size and doc["offset_into_first_range"] == 0
    for xorb, fetches in doc["fetch_info"].items():  # capped, disjoint, and each term inside one
        spans = sorted((f["range"]["start"], f["range"]["end"]) for f in fetches)
        assert all(a[1] <= b[0] for a, b in itertools.pairwise(spans))
        assert all(f["url_range"]["end"] + 1 - f["url_range"]["start"] <= 300 * 1024 for f in fetches)
        for t in (t for t in doc["terms"] if t["hash"] == xorb):
            assert sum(a <= t["range"]["start"] and t["range"]["end"] <= b for a, b in spans) == 1
    assert sum(len(f) for f in doc["fetch_info"].values()) > 3
    assert request(server, "GET", path, {**auth, "Range": f"bytes={size}-{size + 10}"})[0] == 416
    assert request(server, "GET", f"/v2/reconstructions/{'0' * 64}", auth)[0] == 404
    status, _, _ = request(server, "GET", f"/v2/reconstructions/{file_id}", {**auth, "Range": "bytes=5-9"})
    assert status == 200


def test_health_and_telemetry(server: Server) -> None:
    status, _, body = request(server, "GET", "/health")
    doc = json.loads(body)
    assert status == 200 and doc == {"status": "ok", "files": doc["files"], "repos": 2, "catalogue": doc["catalogue"],
                                     "process": doc["process"]}  # fmt: skip
    assert len(doc["catalogue"]) == 16 and doc["process"] != os.getpid()
    others = {json.loads(request(server, "GET", "/health")[2])["catalogue"] for _ in range(10)}
    assert others == {doc["catalogue"]}  # (two processes, one catalogue)
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/telemetry", body=b'{"events": []}', headers={"Content-Type": "application/json"})
    assert conn.getresponse().status == 200
    conn.close()
    status, _, body = request(server, "GET", "/api/agent-harnesses")  # (huggingface_hub asks once a day)
    assert status == 200 and json.loads(body) == {"standardEnvVars": [], "harnesses": {}}


# -- access --------------------------------------------------------------------------------


def test_token_file_and_signed_urls(packed: Packed, tmp_path: Path) -> None:
    tokens, key = tmp_path / "tokens", tmp_path / "key"
    tokens.write_text("# readers\nsecret-token-1\n\nsecret-token-2\n")
    c3 = packed.spec.model_commits[2]
    with xetfs_serve(packed.store, "--token-file", str(tokens), "--key-file", str(key)) as server:
        refused, _ = clients(server, "get", "model", MODEL, "model.safetensors", "main")
        assert (refused["error"], refused["status"]) == ("HfHubHTTPError", 401), refused
        wrong, _ = clients(server, "get", "model", MODEL, "config.json", "main", token="not-a-token")
        assert wrong["status"] == 401, wrong
        got, _cache = clients(server, "get", "model", MODEL, "model.safetensors", "main", token="secret-token-2")
        assert got["sha256"] == sha(packed.original(MODEL, c3, "model.safetensors")), got
        for path in (f"/{MODEL}/resolve/main/config.json", f"/api/models/{MODEL}/revision/main",
                     f"/api/models/{MODEL}/xet-read-token/main"):  # fmt: skip
            assert request(server, "GET", path)[0] == 401, path
            assert request(server, "GET", path, {"Authorization": "Bearer secret-token-1"})[0] == 200, path
        assert request(server, "GET", "/health")[0] == 200
        # A signed xorb URL: valid, altered, expired (signed here with the server's key file).
        _, h, _ = request(server, "HEAD", f"/{MODEL}/resolve/main/model.safetensors",
                          {"Authorization": "Bearer secret-token-1"})  # fmt: skip
        _, _, body = request(server, "GET", f"/api/models/{MODEL}/xet-read-token/main",
                             {"Authorization": "Bearer secret-token-1"})  # fmt: skip
        auth = {"Authorization": f"Bearer {json.loads(body)['accessToken']}"}
        _, _, body = request(server, "GET", f"/v1/reconstructions/{h['x-xet-hash']}", auth)
        (xorb, fetches), *_ = json.loads(body)["fetch_info"].items()
        url = urlsplit(fetches[0]["url"])
        rng = f"bytes={fetches[0]['url_range']['start']}-{fetches[0]['url_range']['end']}"
        status, h, data = request(server, "GET", f"{url.path}?{url.query}", {"Range": rng})
        assert status == 206 and len(data) == fetches[0]["url_range"]["end"] - fetches[0]["url_range"]["start"] + 1
        assert request(server, "GET", f"{url.path}?{url.query[:-2]}xx", {"Range": rng})[0] == 403
        chunks = url.path.rsplit("/", 1)[1]
        expired = int(time.time()) - 5
        signature = Signer(key.read_bytes().strip()).sign("xorb", [xorb, chunks], expired)
        status, _, body = request(server, "GET", f"{url.path}?e={expired}&s={signature}", {"Range": rng})
        assert status == 403 and b"expired" in body
        log = log_of(server)
    for secret in ("secret-token-1", "secret-token-2", "not-a-token", auth["Authorization"].split(" ", 1)[1]):
        assert secret not in log


# -- damage ------------------------------------------------------------------------------------


@pytest.mark.parametrize("xet", [True, False], ids=["hf_xet", "plain"])
def test_a_flipped_byte_fails_only_the_downloads_that_need_it(packed: Packed, tmp_path: Path, xet: bool) -> None:
    store = tmp_path / "store"
    shutil.copytree(packed.store, store)
    c1, _, c3 = packed.spec.model_commits
    repo = next(r for r in load_catalogue(store / "xetfs-hub.json").repos if r.id == MODEL)
    main_weights = repo.blobs[repo.revisions[c3].files["model.safetensors"]].xet_hash
    xorb = damage_one_file(store, main_weights)
    with xetfs_serve(store) as server:
        started = time.monotonic()
        failed, cache = clients(server, "get", "model", MODEL, "model.safetensors", "main", xet=xet)
        took = time.monotonic() - started
        assert failed.get("error") is not None, failed
        assert took < 60, f"the failure took {took:.0f} s"
        blob = cache / "models--acme--tiny-bert" / "blobs" / sha(packed.original(MODEL, c3, "model.safetensors"))
        assert not blob.exists()  # no complete file with wrong bytes
        assert not (cache / "models--acme--tiny-bert" / "snapshots" / c3 / "model.safetensors").exists()
        for name, rev, commit in (("model.safetensors", "v1.0", c1), ("config.json", "main", c3)):
            ok, _ = clients(server, "get", "model", MODEL, name, rev, xet=xet)
            assert ok.get("sha256") == sha(packed.original(MODEL, commit, name)), ok
        log = log_of(server)
    assert f"xorb {xorb}" in log  # the log line names the object
    assert " 410 " in log or "body cut short" in log


# -- other stores and later packs ----------------------------------------------------------------


@pytest.mark.parametrize("xet", [True, False], ids=["hf_xet", "without_hf_xet"])
def test_store_on_s3(packed: Packed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, xet: bool) -> None:
    """The same clients, with and without hf_xet, the server reading the store from moto's S3 server
    (catalogue included)."""
    with moto_s3() as s3:
        for key, value in {**S3_ENV, "AWS_ENDPOINT_URL": s3.url}.items():
            monkeypatch.setenv(key, value)
        copy = tmp_path / "copy"
        shutil.copytree(packed.store, copy)
        (copy / LISTING_NAME).unlink()  # a bucket lists itself
        upload_dir("s3://mirror/hub", s3.url, copy)
        with xetfs_serve("s3://mirror/hub", "--disk-cache-size", "0", "--max-fetch", MAX_FETCH) as server:
            report, cache = clients(server, "all", packed.spec.model_commits[1], xet=xet)
            check_report(packed, report, cache)
            log = log_of(server)
    assert ("GET /v2/reconstructions/" in log) == xet and "ERROR" not in log, log
    assert S3_ENV["AWS_SECRET_ACCESS_KEY"] not in log


def test_a_later_pack_is_served_without_a_restart(packed: Packed, tmp_path: Path) -> None:
    """Each of the two server processes sees the pack when a request of its own misses, whichever answered
    before: the one that handed out the revision or the signed xorb URLs need not be the one asked next."""
    cache = tmp_path / "cache"
    shutil.copytree(packed.spec.root / "datasets--acme--tiny-data", cache / "datasets--acme--tiny-data", symlinks=True)
    store = tmp_path / "store"
    pack(tmp_path, cache, store)
    with xetfs_serve(store, "--workers", "2", "--rescan", "3600") as server:  # (no look at the store but on a miss)
        assert request(server, "GET", f"/api/models/{MODEL}/revision/main")[1]["x-error-code"] == "RepoNotFound"
        pack(tmp_path, packed.spec.root, store)  # the model joins the store
        status, _, body = request(server, "GET", f"/api/models/{MODEL}/revision/main")
        assert status == 200 and json.loads(body)["sha"] == packed.spec.model_commits[2]
        got, _ = clients(server, "get", "model", MODEL, "model.safetensors", "v1.0")
        assert got.get("sha256") == sha(packed.original(MODEL, packed.spec.model_commits[0], "model.safetensors"))


@dataclass
class _MovingMain:
    """A store of the model alone, packed from a cache whose ``main`` is ``old``; ``move`` packs it again with
    ``main`` at ``new``."""

    tmp: Path
    store: Path
    old: str
    new: str

    @classmethod
    def make(cls, packed: Packed, tmp: Path) -> _MovingMain:
        model_dir = "models--" + MODEL.replace("/", "--")
        shutil.copytree(packed.spec.root / model_dir, tmp / "cache" / model_dir, symlinks=True)
        made = cls(tmp, tmp / "store", packed.spec.model_commits[1], packed.spec.model_commits[2])
        made._pack(made.old)
        return made

    def move(self) -> None:
        self._pack(self.new)

    def _pack(self, main: str) -> None:
        (self.tmp / "cache" / ("models--" + MODEL.replace("/", "--")) / "refs" / "main").write_text(main)
        pack(self.tmp, self.tmp / "cache", self.store)


def test_a_branch_a_pack_moves_on_a_remote_store_is_served_within_the_rescan(packed: Packed, tmp_path: Path) -> None:
    """A store on a web server: a later pack moves ``main`` (no request misses anything, ``main`` is known),
    and every server process serves the new commit once its timed look at the catalogue comes."""
    moving = _MovingMain.make(packed, tmp_path)
    store, old, new = moving.store, moving.old, moving.new
    settled(store)

    def main_commits(at: Server) -> set[str]:  # (several requests: either process may answer)
        return {json.loads(request(at, "GET", f"/api/models/{MODEL}/revision/main")[2])["sha"] for _ in range(20)}

    with (
        nginx(store) as web,
        xetfs_serve(web.url, "--workers", "2", "--rescan", "1", "--disk-cache-size", "0") as serving,
    ):
        assert main_commits(serving) == {old}

        def processes() -> set[int]:  # (the ones that answered: each has loaded the catalogue by then)
            return {json.loads(request(serving, "GET", "/health")[2])["process"] for _ in range(20)}

        wait_until(lambda: len(processes()) == 2, 20, "both server processes to answer")
        mark = web.log_mark()  # looks at an unchanged catalogue ask for its tag, and fetch nothing

        def asked(method: str) -> int:
            return sum(m == method and p.endswith(CATALOGUE_NAME) for m, p in web.requests_since(mark))

        wait_until(lambda: main_commits(serving) == {old} and asked("HEAD") >= 2, 20, "timed looks at the catalogue")
        assert asked("GET") == 0
        moving.move()
        wait_until(lambda: main_commits(serving) == {new}, 20, "the new main from every server process")
        got, _ = clients(serving, "get", "model", MODEL, "model.safetensors", "main")
        assert got.get("sha256") == sha(packed.original(MODEL, new, "model.safetensors"))


def test_an_idle_server_of_a_remote_store_looks_at_its_catalogue_on_its_own(packed: Packed, tmp_path: Path) -> None:
    """A push while the server has no request: the server looks at the catalogue every --rescan seconds all the
    same, so the first request after the push gets the new ``main`` (a trial saw the old one a minute after a
    push: looks used to be started by requests, and the first request got what was there before)."""
    moving = _MovingMain.make(packed, tmp_path)
    store, old, new = moving.store, moving.old, moving.new
    with nginx(store) as web, xetfs_serve(web.url, "--workers", "1", "--rescan", "0.5", "--disk-cache-size", "0") as at:
        assert json.loads(request(at, "GET", f"/api/models/{MODEL}/revision/main")[2])["sha"] == old
        version = json.loads(request(at, "GET", "/health")[2])["catalogue"]
        mark = web.log_mark()
        moving.move()
        settled(store)

        def fetched() -> int:  # the catalogue, fetched by the look (then by the load it starts): no request asked
            return sum(m == "GET" and p.endswith(CATALOGUE_NAME) for m, p in web.requests_since(mark))

        wait_until(lambda: fetched() >= 2, 20, "the server's own look to fetch the new catalogue")
        wait_until(lambda: json.loads(request(at, "GET", "/health")[2])["catalogue"] != version, 20,
                   "the store loaded again")  # fmt: skip
        assert json.loads(request(at, "GET", f"/api/models/{MODEL}/revision/main")[2])["sha"] == new


def test_a_timed_look_at_a_stalled_remote_catalogue_holds_back_no_request(packed: Packed) -> None:
    """The look at a remote store's catalogue runs in the background: while the server stalls every request,
    requests that need nothing new from it are answered at once, and the look is said once in the log."""
    options = ("--workers", "1", "--rescan", "0.2", "--disk-cache-size", "0", "--io-timeout", "20")
    with nginx(packed.store) as web, fault_proxy(web) as (proxy, faults), xetfs_serve(proxy.url, *options) as serving:
        assert request(serving, "GET", f"/api/models/{MODEL}/revision/main")[0] == 200
        faults.stall_all = True
        end = time.monotonic() + 2  # (ten timed looks are due in this window; one starts, and stalls)
        while time.monotonic() < end:
            began = time.monotonic()
            assert request(serving, "GET", f"/api/models/{MODEL}/revision/main")[0] == 200
            # (a request that waited for the stalled look would take --io-timeout, 20 s; 5 s leaves room for a
            # loaded machine, as under pytest-xdist)
            assert time.monotonic() - began < 5, "a request waited for the look at the catalogue"
        assert faults.seen.count("stall") == 1, faults.seen
        faults.release()


def test_a_signed_xorb_url_is_served_by_a_process_that_has_not_seen_the_pack(packed: Packed, tmp_path: Path) -> None:
    """Two servers with one key, as processes behind one address: after a pack, ``a`` learns of the model from
    a miss and signs xorb URLs; ``b``, asked for them without having missed anything, looks at the store again
    and serves them."""
    cache, store, key = tmp_path / "cache", tmp_path / "store", str(tmp_path / "key")
    shutil.copytree(packed.spec.root / "datasets--acme--tiny-data", cache / "datasets--acme--tiny-data", symlinks=True)
    pack(tmp_path, cache, store)
    args = ("--workers", "1", "--rescan", "3600", "--key-file", key)
    with xetfs_serve(store, *args) as a, xetfs_serve(store, *args) as b:
        pack(tmp_path, packed.spec.root, store)  # the model joins the store
        _, h, _ = request(a, "HEAD", f"/{MODEL}/resolve/main/model.safetensors")
        _, _, body = request(a, "GET", f"/api/models/{MODEL}/xet-read-token/main")
        auth = {"Authorization": f"Bearer {json.loads(body)['accessToken']}"}
        status, _, body = request(a, "GET", f"/v2/reconstructions/{h['x-xet-hash']}", auth)
        assert status == 200, body
        urls = [f["url"] for fetches in json.loads(body)["xorbs"].values() for f in fetches]
        assert urls and all(u.startswith(a.url) for u in urls)
        for url in urls:
            status, _, data = request(b, "GET", url.removeprefix(a.url))
            assert status == 200 and data, (status, data[:200])
        assert "ERROR" not in log_of(b), log_of(b)


def test_hf_xet_renews_its_token_through_the_refresh_route(packed: Packed) -> None:
    """With tokens shorter-lived than hf_xet's margin, hf_xet asks the token route (JSON) before each use."""
    with xetfs_serve(packed.store, "--token-ttl", "20") as server:
        got, _ = clients(server, "get", "model", MODEL, "model.safetensors", "main")
        assert got.get("sha256") == sha(packed.original(MODEL, packed.spec.model_commits[2], "model.safetensors"))
        log = log_of(server)
    assert log.count("/xet-read-token/") >= 2, log  # huggingface_hub's, then hf_xet's own


def test_two_processes_behind_a_caching_load_balancer(packed: Packed, tmp_path: Path) -> None:
    """Two servers sharing a key file behind nginx (round robin, caching xorb ranges): any of them answers
    any request, and a second download of the same files takes its xorb ranges from nginx's cache."""
    key, front = tmp_path / "key", free_port()
    ttl = 40000  # URLs of a range stay the same until expiry times move on, every 10000 s
    deadline = time.monotonic() + 400
    while -time.time() % (ttl // 4) < 300:  # too close to that moment: wait for it to pass
        assert time.monotonic() < deadline
        time.sleep(1)
    common = ("--key-file", str(key), "--public-url", f"http://127.0.0.1:{front}", "--tree-page-size", PAGE,
              "--max-fetch", MAX_FETCH, "--url-ttl", str(ttl))  # fmt: skip
    with xetfs_serve(packed.store, *common) as a, xetfs_serve(packed.store, *common) as b:
        with nginx_balancer([a.port, b.port], port=front, cache=True) as lb:
            report, cache = clients(lb, "get", "model", MODEL, "model.safetensors", "main")
            first = log_of(a).count("GET /xorbs/") + log_of(b).count("GET /xorbs/")
            report, cache = clients(lb, "all", packed.spec.model_commits[1])
            check_report(packed, report, cache)
            assert lb.log is not None
            cached = lb.log.with_name("cache.log").read_text()
        logs = log_of(a), log_of(b)
    assert first > 0 and "GET /xorbs/" in cached and " HIT" in cached, cached
    for log in logs:  # both took part in the Xet downloads, each with the other's tokens and URLs
        assert "GET /v2/reconstructions/" in log and "GET /xorbs/" in log, log
        assert " 401 " not in log and " 403 " not in log and "ERROR" not in log, log
    hits = [line for line in cached.splitlines() if line.startswith("GET /xorbs/") and line.endswith(" HIT")]
    assert len(hits) >= first  # the main weights' ranges, again: from the cache


def test_serve_listens_on_loopback_and_refuses_a_missing_store(server: Server, tmp_path: Path) -> None:
    assert f"at http://127.0.0.1:{server.port} (2 server processes)" in log_of(server)
    missing = tmp_path / "none"
    for workers in ("1", "3"):  # one error line, however many processes would have served
        proc = subprocess.run([sys.executable, "-m", "xetfs", "serve", str(missing), "--port", str(free_port()),
                               "--workers", workers], capture_output=True, text=True, cwd=REPO_ROOT, timeout=60,
                              check=False)  # fmt: skip
        assert (proc.returncode, proc.stderr) == (1, f"xetfs: error: store {missing}: no such directory\n")


def test_on_every_address_the_urls_name_the_address_each_client_reached(packed: Packed, tmp_path: Path) -> None:
    """``--host 0.0.0.0`` without ``--public-url``: the URLs handed out (the token route, the CAS URL, signed
    xorb URLs) name the address the client used, not this machine's loopback; a Host that is not a host and
    port gets the listening address."""
    with xetfs_serve(packed.store, "--host", "0.0.0.0") as server:
        other = f"127.0.0.2:{server.port}"  # (another address of this machine, as another node would use)
        status, head, _ = request(server, "HEAD", f"/{MODEL}/resolve/main/model.safetensors", {"Host": other})
        assert status == 200 and head["link"].startswith(f"<http://{other}/api/models/{MODEL}/xet-read-token/")
        assert head["vary"] == "Host"  # (a cache in front keeps one answer per address)
        _, named, _ = request(server, "HEAD", f"/{MODEL}/resolve/main/model.safetensors", {"Host": "hf_mirror.:8"})
        assert named["link"].startswith("<http://hf_mirror.:8/api/"), named["link"]
        status, headers, body = request(server, "GET", f"/api/models/{MODEL}/xet-read-token/main", {"Host": other})
        doc = json.loads(body)
        assert status == 200 and doc["casUrl"] == headers["x-xet-cas-url"] == f"http://{other}", doc
        weights = packed.original(MODEL, packed.spec.model_commits[2], "model.safetensors")
        auth = {"Authorization": f"Bearer {doc['accessToken']}", "Host": other}
        status, _, body = request(server, "GET", f"/v2/reconstructions/{head['x-xet-hash']}", auth)
        urls = [u["url"] for fetches in json.loads(body)["xorbs"].values() for u in fetches]
        assert status == 200 and urls and all(u.startswith(f"http://{other}/xorbs/") for u in urls), urls
        for odd in ({"Host": "a b/c"}, {"Host": other, "X-Forwarded-Proto": "https"}, {"Host": other, "Via": "1.1 x"}):
            _, headers, _ = request(server, "HEAD", f"/{MODEL}/resolve/main/model.safetensors", odd)
            assert headers["link"].startswith(f"<http://127.0.0.1:{server.port}/api/"), (odd, headers["link"])
        wait_until(lambda: "give --public-url with the address clients use" in log_of(server), 30, "the log line")
        assert log_of(server).count("give --public-url") <= 2  # (once per server process at most)
        report, _ = clients(replace(server, url=f"http://{other}"), "get", "model", MODEL, "model.safetensors", "main")
        assert report.get("sha256") == sha(weights), report


def test_a_store_that_names_no_repo_is_served_with_a_warning(packed: Packed, tmp_path: Path) -> None:
    store = tmp_path / "store"
    shutil.copytree(packed.store, store)
    (store / CATALOGUE_NAME).unlink()
    with xetfs_serve(store) as server:
        wait_until(lambda: "serving 0 repos" in log_of(server), 60, "the start-up line")
        status, _, _ = request(server, "GET", f"/api/models/{MODEL}")
        log = log_of(server)
    assert status == 404
    assert f"warning: the store names no repo (no {CATALOGUE_NAME} at its top" in log, log
    assert "'xetfs pack --repo' or 'xetfs pack --hub-cache'" in log, log


def _workers_of(server: Server, count: int) -> list[int]:
    """The server processes under ``server``'s parent, once all ``count`` are there."""
    assert server.proc is not None
    pid = server.proc.pid
    wait_until(lambda: len(children(pid)) == count, 60, f"{count} server processes under {pid}: {children(pid)}")
    return children(pid)


def test_server_processes_answer_on_one_port_and_stop_together(packed: Packed) -> None:
    with xetfs_serve(packed.store, "--workers", "3") as server:
        workers = _workers_of(server, 3)
        for _ in range(12):  # a connection each: whichever process takes it, the same answer
            conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
            conn.request("GET", f"/api/models/{MODEL}/revision/main")
            resp = conn.getresponse()
            assert resp.status == 200 and json.loads(resp.read())["sha"], resp.status
            conn.close()
        assert server.proc is not None
        server.proc.terminate()
        assert server.proc.wait(30) == 0, log_of(server)
        wait_until(lambda: all(state(pid) in (None, "Z") for pid in workers), 30, f"workers {workers} ended")
        assert log_of(server).rstrip().endswith("xetfs: stopped serving at http://127.0.0.1:" + str(server.port))


def test_a_killed_server_process_stops_the_others_with_an_error(packed: Packed) -> None:
    with xetfs_serve(packed.store, "--workers", "2") as server:
        first, second = _workers_of(server, 2)
        os.kill(second, signal.SIGKILL)
        assert server.proc is not None
        assert server.proc.wait(30) == 1
        wait_until(lambda: state(first) in (None, "Z"), 30, f"worker {first} ended")
        assert re.search(r"server process [01] was killed by SIGKILL; stopping the others", log_of(server))


def test_damage_past_the_first_block_cuts_a_plain_download_short(tmp_path: Path) -> None:
    """A plain GET sends its status after checking the first 8 MiB; damage further on cuts the body short
    where the damaged block begins: every byte sent is right, and no client keeps the file."""
    src, store = tmp_path / "src", tmp_path / "store"
    src.mkdir()
    data = random.Random(5).randbytes(12 * 1024 * 1024)
    (src / "big.bin").write_bytes(data)
    proc = subprocess.run([sys.executable, "-m", "xetfs", "pack", str(src), str(store), "--repo", "acme/big",
                           "--no-progress"], capture_output=True, text=True, cwd=REPO_ROOT,
                          env=hf_xet_env(tmp_path / "hf_xet"), timeout=180, check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    (repo,) = load_catalogue(store / "xetfs-hub.json").repos
    xorb = damage_one_file(store, next(iter(repo.blobs.values())).xet_hash, at=0.9)  # about 10.8 MiB in
    with xetfs_serve(store) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=60)
        conn.request("GET", "/acme/big/resolve/main/big.bin")
        resp = conn.getresponse()
        assert resp.status == 200 and resp.getheader("content-length") == str(len(data))
        with pytest.raises(http.client.IncompleteRead) as cut:
            resp.read()
        conn.close()
        sent = cut.value.partial
        assert len(sent) == 8 * 1024 * 1024 and sent == data[: len(sent)]
        line = "GET /acme/big/resolve/main/big.bin 200 "
        wait_until(lambda: f"(cut short: {len(sent)} of {len(data)} bytes sent)" in log_of(server), 30, "the log line")
        # A client that goes away after 64 KiB: its request is logged as cut short too, not as a whole 200.
        with socket.create_connection(("127.0.0.1", server.port), timeout=60) as gone:
            gone.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            gone.sendall(b"GET /acme/big/resolve/main/big.bin HTTP/1.1\r\nHost: x\r\n\r\n")
            got = 0
            while got < 64 * 1024:
                got += len(gone.recv(65536))
        wait_until(lambda: log_of(server).count(line) == 2, 60, "the second request's log line")
        second = [x for x in log_of(server).splitlines() if line in x][1]
        assert re.search(rf"\(cut short: \d+ of {len(data)} bytes sent\)$", second), second
        for xet in (False, True):
            failed, cache = clients(server, "get", "model", "acme/big", "big.bin", "main", xet=xet)
            assert failed.get("error") is not None, failed
            if not xet:  # the body cut short (or, resumed, the damaged block's 410)
                assert failed["error"] == "RemoteProtocolError" or failed["status"] == 410, failed
            kept = [p.name for p in cache.glob("models--acme--big/blobs/*") if not p.name.endswith(".incomplete")]
            assert kept == []
        log = log_of(server)
    assert "body cut short" in log and f"xorb {xorb}" in log, log
    assert "Traceback" not in log and "Error in ASGI" not in log, log  # (one line says it all)
