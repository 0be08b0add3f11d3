"""The Hugging Face cache layout from a store on a web server and in a bucket, read by the real clients.

A store packed from a Hugging Face cache (written with huggingface_hub's own
functions) is served by nginx, or pushed to the S3 server (``xetfs push``), and mounted by
URL on a fresh mount point with a fresh disk cache.  With ``HF_HUB_CACHE``
set to the mount and ``HF_HUB_OFFLINE=1``, every client call
(``hub_clients.py``: hf_hub_download, snapshot_download, AutoConfig,
AutoTokenizer, safe_open, ...) must return what it returns on the original
cache, and ``diff -r`` of the two must be empty.  Then the server is
stopped: a new mount with the same disk cache still starts and serves the
files read before.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from helpers import hub_cache, servers
from helpers.hub import Imported, clients, diff, xetfs
from helpers.mounting import mounted

from xetfs.storage.remote import publish

pytestmark = pytest.mark.e2e

fuse = pytest.mark.fuse


@pytest.fixture(scope="module")
def imported(tmp_path_factory: pytest.TempPathFactory) -> Imported:
    tmp = tmp_path_factory.mktemp("hub-remote")
    spec = hub_cache.make_hub_cache(tmp / "cache")
    store = tmp / "store"
    packed = Imported(spec, store, tmp, xetfs(tmp, "pack", "--hub-cache", spec.root, store, "--no-progress"))
    publish(store)
    return packed


@pytest.fixture(scope="module")
def expected(imported: Imported) -> dict[str, object]:
    return clients(imported.spec.root, imported.tmp)


def _the_cache_through(url: str, imported: Imported, expected: dict[str, object], cache: Path) -> None:
    with mounted(url, "--cache-dir", str(cache)) as m:
        m.wait_for_workers()  # (until they are ready, the daemon decodes by itself)
        assert sorted(p.name for p in m.path.iterdir()) == sorted(p.name for p in imported.spec.root.iterdir())
        assert diff(imported.spec.root, m.path) == ""
        got = clients(m.path, imported.tmp)
        stats = m.stats()
    assert got == expected
    assert stats["errors"] == {k: 0 for k in stats["errors"]}
    assert stats["decode"]["in_workers"] > 0, stats["decode"]  # remote stores decode in workers too


def _served_from_the_disk_cache(url: str, imported: Imported, expected: dict[str, object], cache: Path) -> None:
    """The server is down: a new mount starts from what the disk cache holds, and serves what was read."""
    with mounted(url, "--cache-dir", str(cache), "--io-timeout", "5", allow_errors=True) as m:
        assert diff(imported.spec.root, m.path) == ""
        assert clients(m.path, imported.tmp) == expected
        assert m.stats()["remote"]["disk_hits"] > 0


@fuse
def test_hub_cache_from_a_web_server(imported: Imported, expected: dict[str, object], tmp_path: Path) -> None:
    cache = tmp_path / "disk-cache"
    port = servers.free_port()
    with servers.nginx(imported.store, port=port) as web:
        _the_cache_through(web.url, imported, expected, cache)
        ls = subprocess.run([sys.executable, "-m", "xetfs", "ls", web.url, "--cache-dir", str(tmp_path / "ls")],
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
        assert ls.returncode == 0, ls.stderr
        assert hub_cache.MODEL in ls.stdout and "3 revisions" in ls.stdout, ls.stdout
    _served_from_the_disk_cache(f"http://127.0.0.1:{port}", imported, expected, cache)


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[servers.Server]:
    with servers.moto_s3() as s3:
        for key, value in {**servers.S3_ENV, "AWS_ENDPOINT_URL": s3.url}.items():
            monkeypatch.setenv(key, value)
        yield s3


@fuse
def test_hub_cache_from_a_bucket(imported: Imported, expected: dict[str, object], tmp_path: Path,
                                 s3_env: servers.Server) -> None:  # fmt: skip
    url = "s3://mirror/hub"
    servers.make_bucket(s3_env.url, "mirror")
    pushed = subprocess.run([sys.executable, "-m", "xetfs", "push", str(imported.store), url, "--no-progress"],
                            capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert pushed.returncode == 0, pushed.stderr
    cache = tmp_path / "disk-cache"
    _the_cache_through(url, imported, expected, cache)
    s3_env.stop()
    _served_from_the_disk_cache(url, imported, expected, cache)
