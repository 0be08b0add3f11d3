"""Remote stores, against real servers on 127.0.0.1: nginx (HTTP), moto (S3), a fault-injecting proxy.

The store is written by ``xetfs pack`` (hf_xet, with names and a listing).
Every byte read remotely is compared with the original file.
"""

from __future__ import annotations

import errno
import http.server
import json
import os
import random
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest
import trio
from helpers import oracle, servers
from helpers.mounting import mounted, wait_until
from helpers.oracle import CliRunner, hf_xet_env
from helpers.writer import StoreBuilder

from xetfs.base.errors import MissingObjectError, ServerUnreachableError, StoreError
from xetfs.base.settings import TAIL_BYTES
from xetfs.base.stats import RemoteCounters
from xetfs.read.reader import Reader
from xetfs.storage.diskcache import CachedSource, DiskCache
from xetfs.storage.indexer import load_index
from xetfs.storage.layout import LISTING_NAME
from xetfs.storage.objects import ObstoreSource, RemoteOptions, access_hint, client_message, redact, scatter
from xetfs.storage.remote import open_remote
from xetfs.storage.store import Store

pytestmark = pytest.mark.fuse

TOKEN = "tok-8d1f0c2b9e7a4f6d"


@dataclass(frozen=True)
class Packed:
    top: Path  # the store directory (manifest, listing, xet/xorbs/...)
    files: dict[str, bytes]  # name in the manifest -> content
    hashes: dict[str, str]  # name -> xet hash


def _files() -> dict[str, bytes]:
    return {
        "model/weights.bin": oracle.random_bytes(3_000_000, 1),
        "model/config.json": json.dumps({"layers": list(range(2000))}).encode(),
        "data/text.txt": oracle.text_bytes(1_500_000, 2),
        "walk.f32": oracle.float32_walk(300_000, 3),
        "empty": b"",
    }


def _pack(tmp: Path, files: dict[str, bytes]) -> Packed:
    """``files`` written under ``tmp/src`` and packed by ``xetfs pack`` (hf_xet) into ``tmp/store``."""
    src = tmp / "src"
    for name, data in files.items():
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(data)
    top = tmp / "store"
    proc = subprocess.run([sys.executable, "-m", "xetfs", "pack", "--no-progress", str(src), str(top)],
                          capture_output=True, env=hf_xet_env(tmp / "hf_xet"), check=False)  # fmt: skip
    assert proc.returncode == 0, proc.stderr.decode()
    manifest = json.loads((top / "xetfs-manifest.json").read_bytes())
    hashes = {e["path"]: e["xetHash"] for e in manifest if e["type"] == "file"}
    assert (top / LISTING_NAME).is_file()
    return Packed(top, files, hashes)


@pytest.fixture(scope="module")
def packed(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return _pack(tmp_path_factory.mktemp("remote"), _files())


@pytest.fixture(scope="module")
def web(packed: Packed) -> Iterator[servers.Server]:
    with servers.nginx(packed.top) as server:
        yield server


def _check_tree(mnt: Path, packed: Packed) -> None:
    for name, data in packed.files.items():
        assert (mnt / name).read_bytes() == data, name


def _ranges(path: Path, data: bytes, seed: int, count: int = 40) -> None:
    rnd = random.Random(seed)
    fd = os.open(path, os.O_RDONLY)
    try:
        for _ in range(count):
            offset = rnd.randrange(len(data))
            size = rnd.choice([1, 100, 4096, 70_000, 300_000])
            assert os.pread(fd, size, offset) == data[offset : offset + size], (path, offset, size)
    finally:
        os.close(fd)


# -- HTTP with nginx -----------------------------------------------------------------------


def test_ls_cat_verify_over_http(packed: Packed, web: servers.Server, cli: CliRunner, tmp_path: Path) -> None:
    cache = ["--cache-dir", tmp_path / "cache"]
    local = cli("ls", "--json", packed.top)
    remote = cli("ls", "--json", web.url, *cache)
    assert remote.returncode == 0, remote.stderr
    assert json.loads(remote.stdout) == json.loads(local.stdout)
    for name, data in packed.files.items():
        out = cli("cat", web.url, packed.hashes[name], *cache)
        assert out.returncode == 0 and out.stdout == data, (name, out.stderr)
    data = packed.files["model/weights.bin"]
    part = cli("cat", web.url, packed.hashes["model/weights.bin"], "--offset", 1_234_567, "--length", 99_999,
               "--disk-cache-size", 0)  # fmt: skip
    assert part.stdout == data[1_234_567 : 1_234_567 + 99_999]
    report = cli("verify", "--no-progress", web.url, *cache)
    assert report.returncode == 0, report.stderr
    assert report.stdout.startswith(b"OK:")


def test_a_url_with_a_trailing_slash_asks_for_each_path_with_one(packed: Packed, cli: CliRunner) -> None:
    """``http://HOST/store/`` and ``http://HOST/store`` ask the server for the same paths: no ``//`` (which a
    strict server or proxy would not take for ``/``)."""
    with servers.nginx(packed.top.parent) as web:
        listed = cli("ls", "--files", f"{web.url}/{packed.top.name}/", "--disk-cache-size", 0)
        assert listed.returncode == 0, listed.stderr
        asked = re.findall(r'"[A-Z]+ (\S+) ', web.access_log())
    assert asked and not [path for path in asked if "//" in path], asked


def test_verify_through_the_disk_cache_fetches_each_xorb_byte_once(
    packed: Packed, cli: CliRunner, tmp_path: Path, web: servers.Server
) -> None:
    """``verify --use-cache`` reads the xorbs through the disk cache too: a second run fetches none of their
    bytes, and a damaged entry is dropped and its chunks read from the server (no problem in the store)."""
    cache = ["--cache-dir", tmp_path / "cache"]
    xorb_bytes = sum(p.stat().st_size for p in packed.top.rglob("default.*"))
    runs = []
    for _ in range(2):
        mark = web.log_mark()
        report = cli("verify", "--no-progress", "--use-cache", web.url, *cache)
        assert report.returncode == 0 and report.stdout.startswith(b"OK:"), (report.stdout, report.stderr)
        runs.append(web.bytes_sent(since=mark, under="/xorbs/")[0])
    assert xorb_bytes <= runs[0] <= xorb_bytes * 1.02 and runs[1] <= 1, (runs, xorb_bytes)  # (1: the range probe)
    entry = max((tmp_path / "cache" / "chunks").rglob("*-*"), key=lambda p: p.stat().st_size)
    size = entry.stat().st_size
    oracle.flip_byte(entry, size // 2)
    mark = web.log_mark()
    report = cli("verify", "--no-progress", "--use-cache", web.url, *cache)
    assert report.returncode == 0, (report.stdout, report.stderr)
    assert "dropped, fetching them again" in report.stderr
    assert 0 < web.bytes_sent(since=mark, under="/xorbs/")[0] <= size + 1


def test_verify_of_a_url_checks_the_servers_bytes_whatever_the_disk_cache_holds(
    packed: Packed, cli: CliRunner, tmp_path: Path
) -> None:
    copy = tmp_path / "copy"
    oracle.copy_store(oracle.OracleStore(packed.top, (), ()), copy)
    cache = ["--cache-dir", tmp_path / "cache"]
    with servers.nginx(copy) as server:
        filled = cli("ls", "--files", server.url, *cache)
        assert filled.returncode == 0, filled.stderr
        assert f"disk cache {tmp_path / 'cache'}" in filled.stderr  # says where it keeps what it read
        for name in packed.files:
            assert cli("cat", server.url, packed.hashes[name], *cache).returncode == 0  # every chunk cached
        assert cli("verify", "--no-progress", server.url, *cache).returncode == 0
        xorb = max(copy.rglob("default.*"), key=lambda p: p.stat().st_size)
        oracle.flip_byte(xorb, xorb.stat().st_size // 3)
        report = cli("verify", "--no-progress", server.url, *cache)
        assert report.returncode == 3, (report.stdout, report.stderr)
        assert xorb.name.removeprefix("default.") in report.stdout.decode()
        assert "disk cache" not in report.stderr  # it read the server, and kept nothing
        cached = cli("verify", "--no-progress", "--use-cache", server.url, *cache)
        assert "disk cache" in cached.stderr  # says that it reads through the cache


def test_http_store_without_listing_says_how_to_publish(packed: Packed, cli: CliRunner, tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    oracle.copy_store(oracle.OracleStore(packed.top, (), ()), bare)
    (bare / LISTING_NAME).unlink()
    with servers.nginx(bare) as server:
        out = cli("ls", server.url, "--disk-cache-size", 0)
        assert out.returncode == 1
        assert LISTING_NAME in out.stderr and "xetfs publish" in out.stderr, out.stderr
        assert cli("publish", bare).returncode == 0
        assert cli("ls", server.url, "--disk-cache-size", 0).returncode == 0


def test_mount_over_http_names_ranges_stats(packed: Packed, web: servers.Server, tmp_path: Path) -> None:
    with mounted(web.url, "--cache-dir", str(tmp_path / "cache")) as m:
        _check_tree(m.path, packed)
        for name in ("model/weights.bin", "data/text.txt", "walk.f32"):
            _ranges(m / name, packed.files[name], seed=len(name))
        assert (m / ".xetfs/by-hash" / packed.hashes["walk.f32"]).read_bytes() == packed.files["walk.f32"]
        remote = m.stats()["remote"]
        assert remote["requests"] > 0 and remote["bytes"] > 0 and remote["in_flight"] == 0, remote
        assert remote["wait_s"] > 0, remote
        assert remote["disk_misses"] > 0 and remote["disk_bytes"] > 0, remote
    # Only what was read crossed the wire: ranges of xorbs, never a whole one more than once.
    xorbs = sum(p.stat().st_size for p in (packed.top / "xet/xorbs/xorbs").iterdir())
    assert remote["bytes"] < 2 * xorbs


def test_a_shard_whose_copy_in_the_disk_cache_is_bad_is_read_again_from_the_server(
    packed: Packed, tmp_path: Path
) -> None:
    """A shard the server gave damaged (a flipped bit in a hash it records: it parses) is skipped, and its copy
    kept in the disk cache; repaired on the server, the next mount reads it from the server, not the copy."""
    served = tmp_path / "served"
    shutil.copytree(packed.top, served)
    shards = {path: path.read_bytes() for path in (served / "xet/xorbs/shards").glob("*.mdb")}
    for path in shards:
        oracle.flip_byte(path, 48 + 48 + 5)  # (the first term's xorb hash: test_robustness.flipped_term_hash)
    cache = ("--cache-dir", str(tmp_path / "cache"))
    with servers.nginx(served) as server:
        with pytest.raises(AssertionError, match="not to its name"), mounted(server.url, *cache):
            pass  # (every shard of the store is bad: no mount)
        for path, good in shards.items():
            path.write_bytes(good)
        with mounted(server.url, *cache) as m:
            _check_tree(m.path, packed)


def test_bearer_token_is_sent_and_never_shown(
    packed: Packed, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with servers.nginx(packed.top, token=TOKEN) as server:
        refused = cli("ls", server.url, "--disk-cache-size", 0)
        assert refused.returncode == 1 and "refused" in refused.stderr, refused.stderr
        wrong = cli("ls", server.url, "--disk-cache-size", 0, "--header", "Authorization: Bearer wrong-secret-99")
        assert wrong.returncode == 1 and "wrong-secret-99" not in wrong.stderr, wrong.stderr
        ok = cli("ls", server.url, "--disk-cache-size", 0, "--header", f"Authorization: Bearer {TOKEN}")
        assert ok.returncode == 0, ok.stderr
        monkeypatch.setenv("XETFS_HTTP_TOKEN", TOKEN)
        with mounted(server.url, "--disk-cache-size", "0", "--log-level", "debug") as m:
            _check_tree(m.path, packed)
            stats = (m / ".xetfs/stats").read_text()
            text = m.log()
        assert TOKEN not in stats and TOKEN not in text


# -- the disk cache --------------------------------------------------------------------------


def test_background_mount_with_header_keeps_it_out_of_argv(packed: Packed, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with servers.nginx(packed.top, token=TOKEN) as server:
        cmd = [sys.executable, "-m", "xetfs", "mount", server.url, str(mnt), "--disk-cache-size", "0",
               "--header", f"Authorization: Bearer {TOKEN}", "--log-file", str(tmp_path / "log")]  # fmt: skip
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        try:
            assert proc.returncode == 0, proc.stderr
            assert TOKEN not in proc.stderr
            assert (mnt / "data/text.txt").read_bytes() == packed.files["data/text.txt"]
            daemons = [p for p in Path("/proc").iterdir() if p.name.isdigit() and _cmdline(p).count(str(mnt))]
            assert daemons and not any(TOKEN in _cmdline(p) for p in daemons)
        finally:
            subprocess.run([sys.executable, "-m", "xetfs", "umount", str(mnt)], capture_output=True, check=False)
            wait_until(lambda: not os.path.ismount(mnt), 10, "the unmount")
        assert TOKEN not in (tmp_path / "log").read_text()


def _cmdline(proc_dir: Path) -> str:
    try:
        return (proc_dir / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def test_restart_serves_from_cache_with_server_down(packed: Packed, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    port = servers.free_port()
    read = ("model/config.json", "data/text.txt")
    with servers.nginx(packed.top, port=port) as server, mounted(server.url, "--cache-dir", cache) as m:
        for name in read:
            assert (m / name).read_bytes() == packed.files[name]
        url = server.url
    # nginx is stopped: the listing, the manifest, the shards and what was read come from the cache.
    with mounted(url, "--cache-dir", cache, "--io-timeout", "20", allow_errors=True) as m:
        for name in read:
            assert (m / name).read_bytes() == packed.files[name]
        started = time.monotonic()
        with pytest.raises(OSError) as failed:
            (m / "model/weights.bin").read_bytes()  # at most its first and last MiB were cached
        assert failed.value.errno == errno.EIO
        assert time.monotonic() - started < 5, "an uncached read with the server down must fail fast"
        stats = m.stats()
        # Once: the kernel asks again at once for the first page, which fails at once, uncounted.
        assert stats["remote"]["disk_hits"] > 0 and stats["remote"]["failed_reads"] == 1, stats
        # The read's reason is its own request's: not the listing's, which failed first and marked the server down.
        lines = [x for x in m.log().splitlines() if " ERROR " in x and "model/weights.bin" in x]
        assert lines, m.log()
        line = lines[0]
        reason = line.split(" failed: ", 1)[1]
        assert reason.startswith(f"{url}/xet/xorbs/"), line
        assert f"{url}/{LISTING_NAME}" not in reason, line
        assert "server marked down" in reason or "server unreachable" in reason, line


def test_a_cache_that_evicted_still_starts_a_mount_with_the_server_down(packed: Packed, tmp_path: Path) -> None:
    """Eviction takes chunk ranges before the listing, the manifest, the shards and the footers: a node whose
    reads outgrew its disk cache still mounts with the server down, and serves what the cache holds."""
    cache = str(tmp_path / "cache")
    bound = ("--cache-dir", cache, "--disk-cache-size", "3M")
    port = servers.free_port()
    order = ("model/weights.bin", "data/text.txt", "walk.f32", "model/config.json")  # the last read stays cached
    with servers.nginx(packed.top, port=port) as server, mounted(server.url, *bound) as m:
        for name in order:
            assert (m / name).read_bytes() == packed.files[name]
        assert m.stats()["remote"]["disk_evictions"] > 0
        url = server.url
    with mounted(url, *bound, "--io-timeout", "20", allow_errors=True) as m:
        assert (m / "model/config.json").read_bytes() == packed.files["model/config.json"]


def test_a_footer_longer_than_the_tail_is_fetched_once_and_kept_for_a_restart_with_the_server_down(
    tmp_path: Path,
) -> None:
    """A xorb of thousands of small chunks has a footer longer than the tail the first request fetches: the
    rest of it comes with one more request, for the bytes the tail lacks (not the footer again), and the whole
    footer is kept in the disk cache, so that a mount with the server down still serves the cached chunks."""
    from xetfs.base import hashes
    from xetfs.storage.remote import publish

    builder = StoreBuilder(tmp_path / "store")
    data = oracle.random_bytes(6000 * 16, 21)
    file_hash = builder.add_file(data, chunk_size=16)  # 6,000 chunks: a footer of well over 128 KiB
    builder.finish()
    publish(builder.root)
    (xorb,) = builder.xorb_paths.values()
    size = xorb.stat().st_size
    cache, port = str(tmp_path / "cache"), servers.free_port()
    name = f".xetfs/by-hash/{hashes.to_hex(file_hash)}"
    with servers.nginx(builder.root, port=port) as web:
        with mounted(web.url, "--cache-dir", cache) as m:
            assert (m / name).read_bytes() == data
            assert m.stats()["remote"]["disk_misses"] > 0
        sent, requests = web.bytes_sent(under=xorb.name)
    assert size > 2 * TAIL_BYTES and sent <= size, (sent, size, requests)  # each byte of the xorb at most once
    with mounted(web.url, "--cache-dir", cache, "--io-timeout", "5", allow_errors=True) as m:  # nginx is gone
        assert (m / name).read_bytes() == data


def test_a_server_that_ignores_range_requests_fails_reads_at_once_and_says_so(packed: Packed) -> None:
    """Python's http.server answers a range request with the whole file: permanent, so a read fails at once
    (not after --io-timeout of retries), and the log says what the server lacks."""
    options = ("--disk-cache-size", "0", "--io-timeout", "20")
    with servers.python_http_server(packed.top) as server, mounted(server.url, *options, allow_errors=True) as m:
        # Said once the store is open, before any read (the listing and shards are read whole, and work).
        assert "does not answer range requests" in m.log() and "only what the disk cache holds" in m.log(), m.log()
        started = time.monotonic()
        with pytest.raises(OSError) as failed:
            (m / "model/config.json").read_bytes()
        assert failed.value.errno == errno.EIO and time.monotonic() - started < 5
        assert "the server does not answer range requests (it sends whole objects)" in m.log(), m.log()


def test_https_to_a_plain_http_server_fails_at_once_and_says_so(packed: Packed) -> None:
    """A TLS handshake that fails is no transient error: not tried again until the deadline (30 s)."""
    with servers.python_http_server(packed.top) as server:
        url = server.url.replace("http://", "https://")
        source = ObstoreSource(url, RemoteOptions(deadline=30))
        started = time.monotonic()
        with pytest.raises(StoreError) as failed:
            source.read(LISTING_NAME, limit=1 << 20)
    assert time.monotonic() - started < 5 and source.counters.requests == 1
    assert str(failed.value) == (f"{url}/{LISTING_NAME}: the TLS handshake failed: the server does not speak TLS "
                                 f"there (InvalidContentType): is the URL http://, not https://?")  # fmt: skip


def test_a_request_refused_while_the_server_is_down_says_why() -> None:
    """The listing's request finds no server; the xorb read after it is not sent, and says so, naming the
    request that marked the server down (not quoting that request's error as its own)."""
    url = f"http://127.0.0.1:{servers.free_port()}/store"  # nothing listens there
    source = ObstoreSource(url, RemoteOptions(deadline=5, request_timeout=2, connect_timeout=2))
    with pytest.raises(StoreError) as first:
        source.read(LISTING_NAME, limit=1 << 20)
    assert str(first.value) == f"{url}/{LISTING_NAME}: server unreachable: no connection (Connection refused)"
    requests = source.counters.requests
    with pytest.raises(StoreError) as second:
        source.read_range("xet/xorbs/default/" + "ab" * 32, 0, 100)
    message = str(second.value)
    where = f"{url}/xet/xorbs/default/{'ab' * 32} bytes [0, 100): "
    assert message.startswith(f"{where}not requested: server marked down "), message
    assert message.endswith(f" s ago, after {LISTING_NAME} failed: no connection (Connection refused)"), message
    assert f"{url}/{LISTING_NAME}" not in message
    assert source.counters.requests == requests  # not sent


def test_corrupt_cache_entries_are_dropped_and_fetched_again(
    packed: Packed, web: servers.Server, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    with mounted(web.url, "--cache-dir", str(cache)) as m:
        _check_tree(m.path, packed)
    entries = sorted(p for kind in ("meta", "chunks") for p in (cache / kind).rglob("*") if p.is_file())
    assert len(entries) > 3
    for i, path in enumerate(entries):
        if i % 3 == 0:
            oracle.flip_byte(path, path.stat().st_size // 2)
        elif i % 3 == 1:
            oracle.truncate(path, path.stat().st_size // 2)  # as a torn write would leave it
    with mounted(web.url, "--cache-dir", str(cache)) as m:
        _check_tree(m.path, packed)
        remote = m.stats()["remote"]
    assert remote["disk_corrupt"] >= len(entries) * 2 // 3 - 2, remote
    assert remote["disk_hits"] > 0, remote


def test_full_disk_cache_still_serves(packed: Packed, web: servers.Server, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        with mounted(web.url, "--cache-dir", str(small)) as m:
            _check_tree(m.path, packed)
            remote = m.stats()["remote"]
        assert remote["disk_write_errors"] > 0 or remote["disk_evictions"] > 0, remote
    finally:
        subprocess.run(["umount", "-l", str(small)], check=False)


def test_two_mounts_share_one_cache(packed: Packed, web: servers.Server, tmp_path: Path) -> None:
    cache = str(tmp_path / "cache")
    failures: list[BaseException] = []
    with mounted(web.url, "--cache-dir", cache) as a, mounted(web.url, "--cache-dir", cache) as b:

        def read_all(mnt: Path) -> None:
            try:
                for _ in range(2):
                    _check_tree(mnt, packed)
            except BaseException as exc:  # reported below
                failures.append(exc)

        threads = [threading.Thread(target=read_all, args=(m.path,)) for m in (a, b, a, b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert not failures, failures
        hits = a.stats()["remote"]["disk_hits"] + b.stats()["remote"]["disk_hits"]
    assert hits > 0


def test_disk_cache_lru_and_restart(tmp_path: Path) -> None:
    counters = RemoteCounters()
    cache = DiskCache(tmp_path, 10_000, counters)
    for i in range(5):
        cache.put(f"k{i}", bytes([i]) * 1500)
        os.utime(cache.entry_path(f"k{i}"), (1000 + i, 1000 + i))  # a clear order of use
    assert cache.get("k0") is not None  # k0 is now the most recently used
    for i in range(5, 8):
        cache.put(f"k{i}", bytes([i]) * 1500)
    assert counters.disk_evictions > 0 and counters.disk_bytes <= 10_000
    assert cache.get("k1") is None and cache.get("k0") == bytes([0]) * 1500
    again = DiskCache(tmp_path, 10_000)  # a restart, or another mount
    assert again.get("k7") == bytes([7]) * 1500
    assert again.counters.disk_bytes == counters.disk_bytes


def test_disk_cache_bound_holds_for_two_writers(tmp_path: Path) -> None:
    a, b = DiskCache(tmp_path, 20_000), DiskCache(tmp_path, 20_000)
    for i in range(30):
        (a if i % 2 else b).put(f"k{i}", bytes([i]) * 1500)
    on_disk = sum(p.stat().st_size for p in (tmp_path / "meta").rglob("*") if p.is_file())
    assert on_disk <= 20_000, on_disk
    assert a.counters.disk_evictions + b.counters.disk_evictions > 0


class CountingSource:
    """A fake ``ObjectSource`` that records every call (unit tests of ``CachedSource``)."""

    location = "fake://store"

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects = objects
        self.calls: list[tuple[object, ...]] = []
        self.down = False
        self.refused = False

    def read(self, name: str, *, limit: int, fresh: bool = False) -> bytes:
        self.calls.append(("read", name))
        if self.down:
            raise ServerUnreachableError("fake://store: server unreachable")
        if self.refused:
            raise StoreError(f"fake://store/{name}: access refused (HTTP 401)")
        return self.objects[name]

    def read_range(self, name: str, start: int, end: int) -> bytes:
        self.calls.append(("range", name, start, end))
        if self.down:
            raise ServerUnreachableError("fake://store: server unreachable")
        return self.objects[name][start:end]

    def read_range_into(self, name: str, start: int, end: int, parts: Sequence[memoryview]) -> None:
        scatter(self.read_range(name, start, end), parts)

    def list(self, prefix: str) -> list[tuple[str, int, float]] | None:
        return None

    def local_path(self, name: str) -> str | None:
        return None

    def worker_setup(self) -> tuple[str, RemoteOptions] | None:
        return None

    def tag(self, name: str) -> str | None:
        return str(hash(self.objects[name])) if name in self.objects else None


def test_cached_source_keeps_whole_objects_and_falls_back_when_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    fake = CountingSource({"shard": b"S" * 3000, "listing": b"v1"})
    cache = DiskCache(tmp_path, 1 << 20)
    cached = CachedSource(fake, cache)
    assert cached.read("shard", limit=10_000) == b"S" * 3000
    assert cached.read("listing", limit=100, fresh=True) == b"v1"
    fake.calls.clear()
    assert cached.read("shard", limit=10_000) == b"S" * 3000  # from the cache
    assert fake.calls == []
    for path in (tmp_path / "meta").rglob("*"):
        if path.is_file() and path.stat().st_size > 1000:
            oracle.flip_byte(path, path.stat().st_size - 1)
    assert cached.read("shard", limit=10_000) == b"S" * 3000  # failed its check: fetched again
    assert fake.calls == [("read", "shard")]
    assert cache.counters.disk_corrupt == 1
    fake.down = True
    assert cached.read("listing", limit=100, fresh=True) == b"v1"  # the server is down: the cached copy
    said = [r.getMessage() for r in caplog.records if "using the copy" in r.getMessage()]
    assert said == ["fake://store: server unreachable; using the copy in the disk cache"], said
    with pytest.raises(StoreError) as failed:
        cached.read("other", limit=100, fresh=True)
    assert str(failed.value).endswith(f"; the disk cache {tmp_path} has no good copy of it"), failed.value
    fake.down, fake.refused = False, True  # a server that answers and refuses (a wrong token): no copy hides it
    with pytest.raises(StoreError, match=r"access refused \(HTTP 401\)$"):
        cached.read("listing", limit=100, fresh=True)


def test_object_store_urls_and_what_they_show() -> None:
    from xetfs.storage.objects import ObstoreSource, is_url, public_url

    assert is_url("s3://b/p") and is_url("HTTPS://h/p") and not is_url("/srv/store") and not is_url("store")
    assert public_url("https://user:pw@host:8080/a/b/?sig=secret") == "https://host:8080/a/b"
    assert public_url("abfs://container@acct.dfs.core.windows.net/p") == "abfs://container@acct.dfs.core.windows.net/p"
    gcs = ObstoreSource("gs://bucket/prefix", RemoteOptions())  # obstore gives GCS (and Azure) too
    assert gcs.lists and gcs.location == "gs://bucket/prefix"


def test_secrets_go_to_the_daemon_in_its_config_not_argv(tmp_path: Path) -> None:
    from xetfs.commands.cli import build_parser
    from xetfs.commands.mount import _config, daemon_argv
    from xetfs.fuse.daemonconfig import dump_config, load_config

    args = build_parser().parse_args(
        ["mount", f"http://me:{TOKEN}@127.0.0.1:9/s", str(tmp_path), "--header", f"Authorization: Bearer {TOKEN}"]
    )
    config = _config(args)
    argv = daemon_argv(args, config)
    assert not any(TOKEN in a for a in argv), argv
    assert "http://127.0.0.1:9/s" in argv and str(tmp_path.resolve()) in argv
    assert load_config(dump_config(config)) == config  # (the pipe's content: headers and URL as given)
    assert config.headers == (f"Authorization: Bearer {TOKEN}",)
    assert redact(f"GET http://u:{TOKEN}@h/x Bearer {TOKEN}", [TOKEN]) == "GET http://***@h/x Bearer ***"
    signed = "error sending request for url (https://h/b/x.mdb?X-Amz-Signature=abc123&sig=def): reset"
    assert redact(signed, []) == "error sending request for url (https://h/b/x.mdb?***): reset"


def test_a_refused_request_says_what_it_was_sent_with() -> None:
    none = RemoteOptions()
    bearer = RemoteOptions(headers=(("Authorization", f"Bearer {TOKEN}"),))
    assert "no token was sent" in access_hint("https://h/store", none, {})
    assert "an Authorization header was sent" in access_hint("https://h/store", bearer, {})
    assert "signature" in access_hint("https://h/store?sig=1", none, {})
    quiet = {"AWS_CONFIG_FILE": "/nonexistent", "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent"}
    hint = access_hint("s3://b/p", none, quiet)
    assert "endpoint AWS" in hint and "no key pair" in hint, hint
    keyed = {**quiet, "AWS_ACCESS_KEY_ID": "AKIA", "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}
    assert access_hint("s3://b/p", none, keyed) == " (endpoint http://127.0.0.1:9, the key pair of AWS_ACCESS_KEY_ID)"
    assert access_hint("gs://b/p", none, quiet) == ""


def test_a_services_xml_error_reads_as_its_code_and_message() -> None:
    text = ("Generic S3 error: Error performing list request: Client error with status 404 Not Found: <?xml "
            "version=\"1.0\" encoding=\"UTF-8\"?><Error><Code>NoSuchBucket</Code><Message>The specified bucket "
            "does not exist</Message><BucketName>nope</BucketName></Error>\n\nDebug source: ...")  # fmt: skip
    said = client_message(RuntimeError(text), [])
    assert said.endswith("404 Not Found: NoSuchBucket: The specified bucket does not exist"), said
    page = "HTTP error: Client error with status 401 Unauthorized: <html> <head><title>401 Authorization Required"
    assert client_message(RuntimeError(page), []) == "HTTP error: Client error with status 401 Unauthorized"
    listed = ("Generic S3 error: Error performing list request: Error performing GET http://127.0.0.1:5/b?list-type=2 "
              "in 6.271867ms - Server returned non-2xx status code: 403 Forbidden: SignatureDoesNotMatch: The request "
              "signature we calculated does not match the signature you provided. Check your key and signing "
              "method." + " More words." * 20)  # fmt: skip
    said = client_message(RuntimeError(listed), [])
    assert said.startswith(
        "Generic S3 error: Error performing list request: Server returned non-2xx status code: "
        "403 Forbidden: SignatureDoesNotMatch: The request signature we calculated"
    ), said
    assert "127.0.0.1" not in said and said.endswith(" ...") and said[-5:-4] != "W", said


# -- S3 (moto's server) ------------------------------------------------------------------------


def test_s3_store_mounts_as_copied(
    packed: Packed, cli: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with servers.moto_s3() as s3:
        for key, value in {**servers.S3_ENV, "AWS_ENDPOINT_URL": s3.url}.items():
            monkeypatch.setenv(key, value)
        copy = tmp_path / "copy"
        oracle.copy_store(oracle.OracleStore(packed.top, (), ()), copy)
        (copy / LISTING_NAME).unlink()  # a bucket lists itself
        servers.upload_dir("s3://mirror/models/a", s3.url, copy)
        url = "s3://mirror/models/a"
        out = cli("ls", "--json", url, "--disk-cache-size", 0)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout) == json.loads(cli("ls", "--json", packed.top).stdout)
        # A bucket has no directories: a mistyped prefix is refused, not taken for an empty store.
        for command in ("ls", "verify"):
            typo = cli(command, "s3://mirror/models/b", "--disk-cache-size", 0)
            assert typo.returncode == 1, typo.stderr
            assert "s3://mirror/models/b: no objects there (is the bucket or the prefix mistyped?)" in typo.stderr
        parent = cli("ls", "s3://mirror/models", "--disk-cache-size", 0)
        assert parent.returncode == 1 and "there is a store at s3://mirror/models/a" in parent.stderr, parent.stderr
        servers.upload_dir("s3://mirror/other", s3.url, packed.top.parent / "src")  # files, but no store
        other = cli("ls", "s3://mirror/other", "--disk-cache-size", 0)
        assert other.returncode == 1 and "no shards/ or xorbs/ found" in other.stderr, other.stderr
        assert "not a store" in other.stderr and "//" not in other.stderr.replace("s3://", ""), other.stderr
        bucket = cli("ls", "s3://no-such-bucket/x", "--disk-cache-size", 0)
        assert bucket.returncode == 1, bucket.stderr
        assert "store s3://no-such-bucket/x: no such bucket or container (is it mistyped?)" in bucket.stderr
        with mounted(url, "--cache-dir", str(tmp_path / "cache")) as m:
            _check_tree(m.path, packed)
            _ranges(m / "model/weights.bin", packed.files["model/weights.bin"], seed=5)
            stats = (m / ".xetfs/stats").read_text()
        assert servers.S3_ENV["AWS_SECRET_ACCESS_KEY"] not in stats
        # The same from the AWS shared config and credentials files of a named profile.
        for key in (
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
            "AWS_REGION",
            "AWS_DEFAULT_REGION",
            "AWS_ENDPOINT_URL",
        ):
            monkeypatch.delenv(key)
        (tmp_path / "config").write_text(f"[profile mirror]\nregion = us-east-1\nendpoint_url = {s3.url}\n")
        secret = servers.S3_ENV["AWS_SECRET_ACCESS_KEY"]
        (tmp_path / "credentials").write_text(
            f"[mirror]\naws_access_key_id = testing\naws_secret_access_key = {secret}\n"
        )
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
        monkeypatch.setenv("AWS_PROFILE", "mirror")
        out = cli("cat", url, packed.hashes["walk.f32"], "--disk-cache-size", 0)
        assert out.returncode == 0 and out.stdout == packed.files["walk.f32"], out.stderr


# -- faults (a proxy in front of nginx) --------------------------------------------------------


def _read_all(url: str, packed: Packed, counters: RemoteCounters, timeout: float = 10) -> dict[str, bytes]:
    options = RemoteOptions(deadline=timeout, request_timeout=timeout / 3)
    store = open_remote(url, options, counters=counters)
    index = load_index(store).index
    reader = Reader(index, store, cache_size=0)
    out = {}

    async def run() -> None:
        for name, xet_hash in packed.hashes.items():
            entry = index.get(bytes.fromhex(_raw(xet_hash)))
            assert entry is not None
            out[name] = bytes(await reader.read(entry, 0, entry.size))

    trio.run(run)
    return out


def _raw(xet_hex: str) -> str:
    from xetfs.base import hashes

    return hashes.from_hex(xet_hex).hex()


def test_the_wait_of_every_request_for_its_answer_is_counted(
    packed: Packed, web: servers.Server, tmp_path: Path
) -> None:
    """Each range request's wait for its answer is counted, by the daemon and by the decode workers
    (``remote.wait_s`` over ``remote.ranges``): what ``Sessions.slow_store`` tells a far server by."""
    with servers.fault_proxy(web) as (proxy, faults):
        faults.delay = 0.02
        with mounted(proxy.url, "--cache-dir", str(tmp_path / "cache"), "--disk-cache-size", "0") as m:
            m.wait_for_workers()  # (a read before they are up decodes, and waits, in the daemon)
            for name, data in packed.files.items():
                assert (m / name).read_bytes() == data
            stats = m.stats()
    remote = stats["remote"]
    assert stats["decode"]["in_workers"] > 0, stats["decode"]  # (so some waits were counted by workers)
    assert 0 < remote["ranges"] <= remote["requests"] and remote["retries"] == 0, remote
    assert remote["wait_s"] >= faults.delay * remote["ranges"], remote


def test_a_range_read_into_many_parts_is_whole_through_faults(packed: Packed, web: servers.Server) -> None:
    """A range read into many parts (headers and payloads, as a decode worker reads raw chunks in place) gives
    each part its bytes through truncated, slow, reset and refused answers: each try fills the parts anew."""
    xorb = max((packed.top / "xet/xorbs/xorbs").iterdir(), key=lambda p: p.stat().st_size)
    data = xorb.read_bytes()
    name = xorb.relative_to(packed.top).as_posix()
    start, end = 100, min(len(data), 1_000_100)
    buffer, parts = _many_parts(end - start, 5)
    with servers.fault_proxy(web) as (proxy, faults):
        faults.queue.extend(["truncate", "reset", "503", "truncate", "slow"])
        source = ObstoreSource(proxy.url, RemoteOptions(deadline=30, request_timeout=10, connect_timeout=2))
        source.read_range_into(name, start, end, parts)
        assert faults.seen == ["truncate", "reset", "503", "truncate", "slow"] and not faults.queue
    assert bytes(buffer) == data[start:end]
    assert source.counters.retries == 4 and source.counters.ranges == 1, source.counters  # (a slow answer is whole)


def _many_parts(size: int, seed: int) -> tuple[bytearray, list[memoryview]]:
    """A buffer of ``size`` bytes cut into parts as a decode worker cuts a run: 8-byte headers, payloads, odd sizes."""
    rng = random.Random(seed)
    buffer = bytearray(size)
    view, parts, at = memoryview(buffer), [], 0
    while at < size:
        step = min(size - at, rng.choice([8, 8, 1, 65528, rng.randint(1, 200_000)]))
        parts.append(view[at : at + step])
        at += step
    return buffer, parts


class _OddAnswers(http.server.BaseHTTPRequestHandler):
    """Range answers that the socket must not be read for: chunked, or ending the connection."""

    protocol_version = "HTTP/1.1"
    data = b""

    def do_GET(self) -> None:
        first, last = (int(x) for x in self.headers["Range"].removeprefix("bytes=").split("-"))
        body = self.data[first : last + 1]
        self.send_response(206)
        if self.path.startswith("/chunked/"):
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            for at in range(0, len(body), 100_000):
                piece = body[at : at + 100_000]
                self.wfile.write(b"%x\r\n" % len(piece) + piece + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        else:
            self.send_header("Content-Length", str(len(body)))
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_range_reads_fill_parts_straight_from_the_socket_and_fall_back_for_other_answers(
    packed: Packed, web: servers.Server, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Over a kept-alive plain connection with a sized answer, a range's parts are filled by scatter reads of the
    socket, and the connection serves the next range; chunked answers and answers that end the connection are
    read through ``http.client``.  Either way every part gets its bytes."""
    from xetfs.storage import objects

    used: list[str] = []

    def spy(name: str) -> Callable[..., int]:
        real = getattr(objects, name)

        def call(*args: object) -> int:
            used.append(name)
            got: int = real(*args)
            return got

        return call

    for helper in ("_scatter_body", "_read_body"):
        monkeypatch.setattr(objects, helper, spy(helper))
    xorb = max((packed.top / "xet/xorbs/xorbs").iterdir(), key=lambda p: p.stat().st_size)
    data = xorb.read_bytes()
    name = xorb.relative_to(packed.top).as_posix()
    options = RemoteOptions(deadline=10, request_timeout=5, connect_timeout=2)
    source = ObstoreSource(web.url, options)
    sockets = []
    for seed, (start, end) in enumerate([(0, 9), (100, 1_000_100), (5, len(data))]):
        buffer, parts = _many_parts(end - start, seed)
        source.read_range_into(name, start, end, parts)
        assert bytes(buffer) == data[start:end], (start, end)
        assert source._http is not None
        sockets += [conn.sock for conn in source._http._idle]
    assert used == ["_scatter_body"] * 3 and source.counters.requests == 3, (used, source.counters)
    assert len(sockets) == 3 and len(set(sockets)) == 1, sockets  # one connection served all three

    _OddAnswers.data = data
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _OddAnswers)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        for kind in ("chunked", "closing"):
            used.clear()
            odd = ObstoreSource(f"http://127.0.0.1:{server.server_address[1]}/{kind}", options)
            buffer, parts = _many_parts(700_000, 9)
            odd.read_range_into("x", 1000, 701_000, parts)
            assert bytes(buffer) == data[1000:701_000] and used == ["_read_body"], (kind, used)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def test_range_reads_of_the_own_client_fail_as_the_general_clients_do(packed: Packed, web: servers.Server) -> None:
    """The plain HTTP client of range reads (``read_range_into``) says what failed by the errors it raises, not
    by words the general client's errors are read for: a missing object is ``MissingObjectError`` at once, a
    refusal a ``StoreError`` at once, and a server nobody answers for is unreachable at once (not tried again
    until the deadline)."""
    options = RemoteOptions(deadline=20, request_timeout=5, connect_timeout=2)
    source = ObstoreSource(web.url, options)
    buffer = bytearray(10)
    began = time.monotonic()
    with pytest.raises(MissingObjectError, match="not found"):
        source.read_range_into("xet/xorbs/xorbs/" + "0" * 64, 0, 10, [memoryview(buffer)])
    with pytest.raises(StoreError, match=r"access refused \(HTTP 403"):  # (nginx: a directory without an index)
        source.read_range_into("xet/xorbs/", 0, 10, [memoryview(buffer)])
    closed = ObstoreSource(f"http://127.0.0.1:{servers.free_port()}", options)
    with pytest.raises(ServerUnreachableError, match="server unreachable: no connection"):
        closed.read_range_into("x", 0, 10, [memoryview(buffer)])
    assert time.monotonic() - began < 5 and source.counters.retries == closed.counters.retries == 0


class _NoHead(http.server.BaseHTTPRequestHandler):
    """A server that refuses HEAD (405) and has nothing (404)."""

    def do_HEAD(self) -> None:
        self.send_error(405)

    def do_GET(self) -> None:
        self.send_error(404)

    def log_message(self, *args: object) -> None:
        pass


def test_a_url_of_the_xet_folders_of_a_store_on_a_web_server_names_the_store(web: servers.Server) -> None:
    """Over HTTP the listing lies at the store's top, so ``TOP/xet`` has none: the store is named, not the
    missing listing.  A server that refuses ``HEAD`` cannot say: the URL's own error stands."""
    for inner in (f"{web.url}/xet", f"{web.url}/xet/xorbs"):
        with pytest.raises(StoreError, match=f"xet folders of the store {web.url}.*give {web.url}$"):
            open_remote(inner)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _NoHead)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        with pytest.raises(StoreError, match=f"no {LISTING_NAME} there"):
            open_remote(f"http://127.0.0.1:{server.server_address[1]}/mirror/xet")
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


@pytest.fixture(scope="module")
def small_files(tmp_path_factory: pytest.TempPathFactory) -> Packed:
    """A directory of 240 small files (200 B to 8 KB, about one chunk each), packed by hf_xet."""
    rng = random.Random(11)
    files = {f"f{i:04d}.bin": oracle.random_bytes(rng.randint(200, 8000), 100 + i) for i in range(240)}
    return _pack(tmp_path_factory.mktemp("small"), files)


def _pack_order(packed: Packed) -> list[str]:
    """The files by where their first chunk lies in the store: the order a read-ahead follows."""
    index = load_index(Store.open(packed.top)).index
    where = {}
    for name, xet in packed.hashes.items():
        entry = index.get(bytes.fromhex(_raw(xet)))
        assert entry is not None and entry.num_terms, name
        where[name] = (entry.xorb_ids[0], entry.starts[0])
    return sorted(packed.files, key=where.__getitem__)


def test_small_files_read_in_the_order_they_were_packed_take_few_requests_and_shuffled_no_more_bytes(
    small_files: Packed, tmp_path: Path
) -> None:
    """Over HTTP, a read that goes on where the last read of its xorb ended reads ahead: small files read in
    the order they were packed (as ``cat *`` reads what was packed from one directory, and ``cp -r``, which
    reads in inode order: files are numbered in pack order) cost a few requests, not one each.  Read shuffled,
    each costs its own request and nginx sends no more bytes than the files need."""
    order = _pack_order(small_files)
    needed = sum(len(d) for d in small_files.files.values())
    xorbs = len(list((small_files.top / "xet/xorbs/xorbs").iterdir()))
    shuffled = random.Random(3).sample(order, len(order))
    with servers.nginx(small_files.top) as web:
        for name in ("packed", "cp -r", "shuffled"):
            mark = web.log_mark()
            with mounted(web.url, "--disk-cache-size", "0") as m:
                if name == "cp -r":
                    subprocess.run(["cp", "-r", str(m.path), str(tmp_path / "copy")], check=True)
                    for n, data in small_files.files.items():
                        assert (tmp_path / "copy" / n).read_bytes() == data, (name, n)
                else:
                    for n in order if name == "packed" else shuffled:
                        assert (m / n).read_bytes() == small_files.files[n], (name, n)
                store = m.stats()["store"]
            sent, requests = web.bytes_sent(since=mark, under="/xorbs/xorbs/")  # (counted by nginx)
            assert requests == store["reads"] + store["layouts"], (requests, store)  # chunk ranges, footers
            if name == "shuffled":
                assert store["reads"] >= len(order) * 9 // 10, store
            else:
                assert store["reads"] <= len(order) // 10, (name, store)  # (240 files: one request each before)
            assert sent <= needed * 1.02 + TAIL_BYTES * xorbs, (name, sent, needed)  # (chunk headers, footers)


def test_small_files_read_in_the_order_they_were_packed_read_ahead_on_a_local_store_too(small_files: Packed) -> None:
    """On the store directory, the same read-ahead turns the files' one store read each (a decode by the
    daemon, on the way to the reader) into a run every few dozen files, decoded by a worker."""
    order = _pack_order(small_files)
    for name in ("packed", "shuffled"):
        with mounted(small_files.top) as m:
            m.wait_for_workers()
            for n in order if name == "packed" else random.Random(3).sample(order, len(order)):
                assert (m / n).read_bytes() == small_files.files[n], (name, n)
            stats = m.stats()
        store, decode = stats["store"], stats["decode"]
        if name == "packed":
            prefetch = stats["prefetch"]
            assert store["reads"] <= len(order) // 10 and prefetch["chunks"] > len(order) // 2, (store, prefetch)
            assert decode["in_workers"] >= decode["chunks"] // 2, decode
        else:
            assert store["reads"] >= len(order) * 9 // 10, store


def test_retries_give_correct_bytes(packed: Packed, web: servers.Server) -> None:
    with servers.fault_proxy(web) as (proxy, faults):
        faults.queue.extend(["503", "429", "reset", "truncate", "slow", "500", "reset", "truncate", "503"] * 2)
        counters = RemoteCounters()
        got = _read_all(proxy.url, packed, counters)
        assert got == packed.files
        assert not faults.queue, "every fault was met"
        assert counters.retries >= 16 - 2, counters  # "slow" answers are whole, and need no retry
        assert counters.errors >= counters.retries and counters.in_flight == 0


def _fails_at_once(path: Path) -> bool:
    """Whether reading ``path`` fails with EIO within a second."""
    started = time.monotonic()
    try:
        path.read_bytes()
    except OSError as exc:
        return exc.errno == errno.EIO and time.monotonic() - started < 1
    return False


def test_stalled_server_gives_eio_in_time_and_umount_works(packed: Packed, web: servers.Server) -> None:
    with (
        servers.fault_proxy(web) as (proxy, faults),
        mounted(proxy.url, "--disk-cache-size", "0", "--io-timeout", "3", allow_errors=True) as m,
    ):
        assert (m / "model/config.json").read_bytes() == packed.files["model/config.json"]
        faults.stall_all = True
        started = time.monotonic()
        with pytest.raises(OSError) as failed:
            (m / "data/text.txt").read_bytes()
        took = time.monotonic() - started
        assert failed.value.errno == errno.EIO
        # Once: the kernel asks again at once, a page at a time, and that read fails at once.
        assert took < 5, f"a stalled read took {took:.1f} s with --io-timeout 3"
        assert m.stats()["errors"]["timeout"] == 1, m.stats()["errors"]
        # The store is taken for hung: for --io-timeout, reads that would fetch fail at once, not each after
        # waiting out --io-timeout; bytes held are still served.
        assert _fails_at_once(m / "model/weights.bin")
        assert (m / "model/config.json").read_bytes() == packed.files["model/config.json"]
        time.sleep(max(0.0, started + took + 3.5 - time.monotonic()))
        # Then one read at a time tries the store again (it waits, stuck), and the others still fail at once.
        stuck = subprocess.Popen(["cat", str(m / "walk.f32")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            # (Its fetch waits in the daemon, or in a decode worker until the job's time bound.)
            time.sleep(1)
            assert stuck.poll() is None, "the read that tries the store again does not wait for it"
            assert _fails_at_once(m / "model/weights.bin")
            assert _fails_at_once(m / "data/text.txt")
            # Logged once for all the files: the store's state is the one failure.
            assert m.log().count("not requested: the store answered no request within 3 s") == 1, m.log()
            remote = m.stats()["remote"]
            assert remote["hung"] == 1 and remote["not_requested"] >= 3, remote
            # Stuck requests do not stop the mount from answering, or from unmounting.
            assert sorted(os.listdir(m.path)) == ["data", "empty", "model", "walk.f32"]
            umount = subprocess.run([sys.executable, "-m", "xetfs", "umount", "-z", str(m.path)],
                                    capture_output=True, timeout=10, check=False)  # fmt: skip
            assert umount.returncode == 0, umount.stderr
            wait_until(lambda: m.proc.poll() is not None, 15, "the daemon to exit after umount")
        finally:
            faults.release()
            stuck.wait(15)
